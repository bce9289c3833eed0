// quant.cpp — ggml block formats: type table, fp16/bf16 conversion, row dequantization
// and dot products against fp32 vectors: the plain scalar reference.
//
// Block byte layouts follow the ggml definitions (see docs/engine.md, "Quant blocks, bit
// by bit"); all fields are read with memcpy so rows need no particular alignment. Portable
// C++ only: no intrinsics, nothing that depends on the instruction set. The CPU backend's
// vector versions of these operations (per instruction set, chosen at run time) are in
// engine/cpu/rows_impl.h; its tests check them against this file.
#include "engine/quant.h"

#include <cmath>
#include <cstring>

namespace kvscope {
namespace {

// Indexed by ggml type id. Ids with a null name were removed from ggml (no layout).
constexpr TypeTraits kTraits[] = {
    {"F32", 1, 4, true},          // 0
    {"F16", 1, 2, true},          // 1
    {"Q4_0", 32, 18, true},       // 2
    {"Q4_1", 32, 20, true},       // 3
    {nullptr, 0, 0, false},       // 4 (removed Q4_2)
    {nullptr, 0, 0, false},       // 5 (removed Q4_3)
    {"Q5_0", 32, 22, true},       // 6
    {"Q5_1", 32, 24, true},       // 7
    {"Q8_0", 32, 34, true},       // 8
    {"Q8_1", 32, 36, false},      // 9
    {"Q2_K", 256, 84, false},     // 10
    {"Q3_K", 256, 110, false},    // 11
    {"Q4_K", 256, 144, true},     // 12
    {"Q5_K", 256, 176, true},     // 13
    {"Q6_K", 256, 210, true},     // 14
    {"Q8_K", 256, 292, false},    // 15
    {"IQ2_XXS", 256, 66, false},  // 16
    {"IQ2_XS", 256, 74, false},   // 17
    {"IQ3_XXS", 256, 98, false},  // 18
    {"IQ1_S", 256, 50, false},    // 19
    {"IQ4_NL", 32, 18, false},    // 20
    {"IQ3_S", 256, 110, false},   // 21
    {"IQ2_S", 256, 82, false},    // 22
    {"IQ4_XS", 256, 136, false},  // 23
    {"I8", 1, 1, false},          // 24
    {"I16", 1, 2, false},         // 25
    {"I32", 1, 4, false},         // 26
    {"I64", 1, 8, false},         // 27
    {"F64", 1, 8, false},         // 28
    {"IQ1_M", 256, 56, false},    // 29
    {"BF16", 1, 2, true},         // 30
    {nullptr, 0, 0, false},       // 31 (removed Q4_0_4_4)
    {nullptr, 0, 0, false},       // 32 (removed Q4_0_4_8)
    {nullptr, 0, 0, false},       // 33 (removed Q4_0_8_8)
    {"TQ1_0", 256, 54, false},    // 34
    {"TQ2_0", 256, 66, false},    // 35
    {nullptr, 0, 0, false},       // 36 (removed IQ4_NL_4_4)
    {nullptr, 0, 0, false},       // 37 (removed IQ4_NL_4_8)
    {nullptr, 0, 0, false},       // 38 (removed IQ4_NL_8_8)
    {"MXFP4", 32, 17, false},     // 39
};
constexpr uint32_t kNumTraits = sizeof(kTraits) / sizeof(kTraits[0]);

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline float fp16_scalar(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (exp == 31) {
    // inf, or NaN with its payload kept and made quiet (as the F16C instructions do, so
    // every path of the CPU backend gives these bits).
    bits = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

inline float f16(const uint8_t* p) {
  return fp16_scalar(load_u16(p));
}

// ---- dequantization of one block (dst gets block_size values) ----

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const uint32_t h = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((h >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const uint32_t h = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((h >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// 6-bit scale and min k (0..7) of a Q4_K block, packed into 12 bytes.
inline void q4k_scale_min(int k, const uint8_t* s, int* sc, int* mn) {
  if (k < 4) {
    *sc = s[k] & 63;
    *mn = s[k + 4] & 63;
  } else {
    *sc = (s[k + 4] & 0xF) | ((s[k - 4] >> 6) << 4);
    *mn = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

// Q4_K (qh null) and Q5_K: d, dmin, the eight 6-bit (scale, min) pairs, then for Q5_K
// qh[32] (value k's fifth bit is bit k / 32 of qh[k % 32]), then the nibbles at qs.
void deq_k4(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = f16(b), dmin = f16(b + 2);
  const uint8_t* scales = b + 4;
  for (int g = 0; g < 4; ++g) {
    int sc0, mn0, sc1, mn1;
    q4k_scale_min(2 * g, scales, &sc0, &mn0);
    q4k_scale_min(2 * g + 1, scales, &sc1, &mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    const uint8_t* q = qs + 32 * g;
    float* out = y + 64 * g;
    for (int l = 0; l < 32; ++l) {
      const int h0 = qh ? ((qh[l] >> (2 * g)) & 1) << 4 : 0;
      const int h1 = qh ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0;
      out[l] = d0 * static_cast<float>((q[l] & 0xF) | h0) - m0;
      out[l + 32] = d1 * static_cast<float>((q[l] >> 4) | h1) - m1;
    }
  }
}

void deq_q4_k(const uint8_t* b, float* y) { deq_k4(b, nullptr, b + 16, y); }
void deq_q5_k(const uint8_t* b, float* y) { deq_k4(b, b + 16, b + 48, y); }

void deq_q6_k(const uint8_t* b, float* y) {
  const float d = f16(b + 208);
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b + 64 * n;
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
    float* out = y + 128 * n;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

using BlockDeq = void (*)(const uint8_t*, float*);

BlockDeq block_dequantizer(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0:
      return deq_q4_0;
    case GgmlType::Q4_1:
      return deq_q4_1;
    case GgmlType::Q5_0:
      return deq_q5_0;
    case GgmlType::Q5_1:
      return deq_q5_1;
    case GgmlType::Q8_0:
      return deq_q8_0;
    case GgmlType::Q4_K:
      return deq_q4_k;
    case GgmlType::Q5_K:
      return deq_q5_k;
    case GgmlType::Q6_K:
      return deq_q6_k;
    default:
      return nullptr;
  }
}

// ---- dot products (one accumulator, in order of the index) ----

float dot_floats(const float* a, const float* x, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * x[i];
  return sum;
}

float dot_f16(const uint8_t* row, const float* x, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += f16(row + 2 * i) * x[i];
  return sum;
}

float dot_bf16(const uint8_t* row, const float* x, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += bf16_to_fp32(load_u16(row + 2 * i)) * x[i];
  return sum;
}

// Q8_0: sum_b d_b * sum_j q_bj * x_bj.
float dot_q8_0(const uint8_t* row, const float* x, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + 34 * b;
    const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
    const float* xb = x + 32 * b;
    float t = 0.0f;
    for (int j = 0; j < 32; ++j) t += static_cast<float>(qs[j]) * xb[j];
    sum += f16(blk) * t;
  }
  return sum;
}

// Q4_1: sum_b sum_j (q_bj * d_b + m_b) * x_bj. Low nibble of byte j is value j, high
// nibble is value j + 16.
float dot_q4_1(const uint8_t* row, const float* x, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + 20 * b;
    const uint8_t* qs = blk + 4;
    const float* xb = x + 32 * b;
    float t = 0.0f, xs = 0.0f;
    for (int j = 0; j < 16; ++j) {
      t += static_cast<float>(qs[j] & 0xF) * xb[j] + static_cast<float>(qs[j] >> 4) * xb[j + 16];
      xs += xb[j] + xb[j + 16];
    }
    sum += f16(blk) * t + f16(blk + 2) * xs;
  }
  return sum;
}

// Q4_0: sum_b d_b * sum_j (q_bj - 8) * x_bj.
float dot_q4_0(const uint8_t* row, const float* x, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + 18 * b;
    const uint8_t* qs = blk + 2;
    const float* xb = x + 32 * b;
    float t = 0.0f;
    for (int j = 0; j < 16; ++j) {
      t += static_cast<float>((qs[j] & 0xF) - 8) * xb[j] +
           static_cast<float>((qs[j] >> 4) - 8) * xb[j + 16];
    }
    sum += f16(blk) * t;
  }
  return sum;
}

// Any block type: dequantize one block into a stack buffer, then dot.
float dot_blockwise(BlockDeq deq, const TypeTraits& tt, const uint8_t* row, const float* x,
                    int64_t n) {
  float buf[256];
  const int64_t bs = tt.block_size;
  float sum = 0.0f;
  for (int64_t i = 0, b = 0; i < n; i += bs, ++b) {
    deq(row + b * tt.type_size, buf);
    sum += dot_floats(buf, x + i, bs);
  }
  return sum;
}

}  // namespace

const TypeTraits* type_traits(uint32_t type_id) {
  if (type_id >= kNumTraits || kTraits[type_id].name == nullptr) return nullptr;
  return &kTraits[type_id];
}

bool type_supported(GgmlType t) {
  const TypeTraits* tt = type_traits(t);
  return tt != nullptr && tt->supported;
}

uint64_t row_bytes(GgmlType t, uint64_t n) {
  const TypeTraits* tt = type_traits(t);
  if (!tt || n % tt->block_size != 0) return 0;
  return n / tt->block_size * tt->type_size;
}

float fp16_to_fp32(uint16_t h) {
  return fp16_scalar(h);
}

uint16_t fp32_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): adding 0.5 puts the 2^-24 unit in the last fp32
    // mantissa bit, so the fp32 addition performs the round-to-nearest-even for us.
    float af;
    std::memcpy(&af, &a, 4);
    af += 0.5f;
    uint32_t r;
    std::memcpy(&r, &af, 4);
    return static_cast<uint16_t>(sign | (r - 0x3f000000u));
  }
  const uint32_t odd = (a >> 13) & 1u;
  a += 0xc8000000u + 0xfffu + odd;  // rebias exponent 127 -> 15, round to nearest even
  return static_cast<uint16_t>(sign | (a >> 13));
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(p + 2 * i));
      return;
    default:
      break;
  }
  const BlockDeq deq = block_dequantizer(t);
  const TypeTraits* tt = type_traits(t);
  if (!deq || !tt) return;  // unsupported type: callers check type_supported first
  for (int64_t i = 0, b = 0; i < n; i += tt->block_size, ++b) deq(p + b * tt->type_size, dst + i);
}

float vec_dot(GgmlType t, const void* row, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(row);
  switch (t) {
    case GgmlType::F32:
      return dot_floats(reinterpret_cast<const float*>(row), x, n);
    case GgmlType::F16:
      return dot_f16(p, x, n);
    case GgmlType::BF16:
      return dot_bf16(p, x, n);
    case GgmlType::Q8_0:
      return dot_q8_0(p, x, n / 32);
    case GgmlType::Q4_1:
      return dot_q4_1(p, x, n / 32);
    case GgmlType::Q4_0:
      return dot_q4_0(p, x, n / 32);
    default:
      break;
  }
  const BlockDeq deq = block_dequantizer(t);
  const TypeTraits* tt = type_traits(t);
  if (!deq || !tt) return 0.0f;  // unsupported type: callers check type_supported first
  return dot_blockwise(deq, *tt, p, x, n);
}

}  // namespace kvscope
