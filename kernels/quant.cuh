// quant.cuh — device-side decoding of ggml quant blocks (one value at a time).
//
// dequant_value(type, row, i) returns value i of a row stored in `type`. Block layouts
// follow the GGUF/ggml formats (see docs/engine.md, "Quant blocks, bit by bit"); scales
// are IEEE binary16 read byte-wise, so rows need no alignment beyond 1 byte.
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

namespace kvscope::cuda {

__host__ __device__ __forceinline__ float ld_f16(const uint8_t* p) {
  __half_raw r;
  r.x = static_cast<unsigned short>(p[0] | (p[1] << 8));
  return __half2float(__half(r));
}

__host__ __device__ __forceinline__ float q4k_scale_min(const uint8_t* s, int k, float* mn) {
  int sc, m;
  if (k < 4) {
    sc = s[k] & 63;
    m = s[k + 4] & 63;
  } else {
    sc = (s[k + 4] & 0xF) | ((s[k - 4] >> 6) << 4);
    m = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
  *mn = static_cast<float>(m);
  return static_cast<float>(sc);
}

__host__ __device__ inline float dequant_value(QType type, const uint8_t* row, int64_t i) {
  switch (type) {
    case QType::F32: {
      float f;
      memcpy(&f, row + 4 * i, 4);
      return f;
    }
    case QType::F16: return ld_f16(row + 2 * i);
    case QType::BF16: {
      const unsigned u = (unsigned(row[2 * i]) | (unsigned(row[2 * i + 1]) << 8)) << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case QType::Q8_0: {
      const uint8_t* b = row + (i / 32) * 34;
      return ld_f16(b) * static_cast<float>(static_cast<int8_t>(b[2 + i % 32]));
    }
    case QType::Q4_0: {
      const uint8_t* b = row + (i / 32) * 18;
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
      return ld_f16(b) * static_cast<float>(q - 8);
    }
    case QType::Q4_1: {
      const uint8_t* b = row + (i / 32) * 20;
      const int j = static_cast<int>(i % 32);
      const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
      return ld_f16(b) * static_cast<float>(q) + ld_f16(b + 2);
    }
    case QType::Q5_0:
    case QType::Q5_1: {
      const bool has_min = type == QType::Q5_1;
      const uint8_t* b = row + (i / 32) * (has_min ? 24 : 22);
      const uint8_t* qh = b + (has_min ? 4 : 2);
      const uint8_t* qs = qh + 4;
      const int j = static_cast<int>(i % 32);
      const unsigned h = unsigned(qh[0]) | (unsigned(qh[1]) << 8) | (unsigned(qh[2]) << 16) |
                         (unsigned(qh[3]) << 24);
      const int lo = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
      const int q = lo | static_cast<int>(((h >> j) & 1u) << 4);
      if (has_min) return ld_f16(b) * static_cast<float>(q) + ld_f16(b + 2);
      return ld_f16(b) * static_cast<float>(q - 16);
    }
    case QType::Q4_K:
    case QType::Q5_K: {  // Q5_K: Q4_K's fields, its nibbles past qh[32], bit r/32 of qh[r%32]
      const bool q5 = type == QType::Q5_K;
      const uint8_t* b = row + (i / 256) * (q5 ? 176 : 144);
      const int r = static_cast<int>(i % 256);
      const int g = r / 64, within = r % 64, l = within % 32, hi = within / 32;
      float mn;
      const float sc = q4k_scale_min(b + 4, 2 * g + hi, &mn);
      const uint8_t q = b[(q5 ? 48 : 16) + 32 * g + l];
      const int high = q5 ? ((b[16 + l] >> (r / 32)) & 1) << 4 : 0;
      const int nib = (hi ? (q >> 4) : (q & 0xF)) | high;
      return ld_f16(b) * sc * static_cast<float>(nib) - ld_f16(b + 2) * mn;
    }
    case QType::Q6_K: {
      const uint8_t* b = row + (i / 256) * 210;
      const int r = static_cast<int>(i % 256);
      const int n = r / 128, rr = r % 128, l = rr % 32, part = rr / 32, is = l / 16;
      const uint8_t* ql = b + 64 * n;
      const uint8_t* qh = b + 128 + 32 * n;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * n;
      const int lowq = (part & 1) ? ql[l + 32] : ql[l];
      const int low = part < 2 ? (lowq & 0xF) : (lowq >> 4);
      const int high = (qh[l] >> (2 * part)) & 3;
      const int q = (low | (high << 4)) - 32;
      return ld_f16(b + 208) * static_cast<float>(sc[is + 2 * part]) * static_cast<float>(q);
    }
  }
  return 0.0f;
}

}  // namespace kvscope::cuda
