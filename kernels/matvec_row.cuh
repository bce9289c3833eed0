// matvec_row.cuh — device helpers shared by the quantized matvec kernels (matmul.cu,
// matmul_qkv.cu and matmul_glu.cu): decoding 16-value units of Q4_1 / Q8_0 rows and one warp's
// partial dot products of a row with up to kRowsAtOnce activation rows.
//
// Invariants: rows hold n_in values, n_in a multiple of 32 (whole blocks); each lane
// handles units lane, lane + 32, ... and returns its partial sums (the caller reduces
// them with warp_sum). All 32 lanes of the warp must take part in that reduction.
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"
#include "kernels/quant.cuh"

namespace kvscope::cuda {

inline constexpr int kMatvecWarpsPerBlock = 8;
inline constexpr int kRowsAtOnce = 4;

// Activations in shared memory are stored padded: one unused float after every 16 values
// (value i at padded_index(i)). A lane reads the 16 consecutive values of its unit, so
// unpadded, the 32 lanes' reads of value k of their units fall in 2 of the 32 banks (a
// 16-way conflict); padded, unit u starts at 17u and every lane has a bank of its own.
__host__ __device__ constexpr int64_t padded_index(int64_t i) {
  return i + (i >> 4);
}
// Floats of a padded row of n values (n a multiple of 16 or not).
__host__ __device__ constexpr int64_t padded_len(int64_t n) {
  return n + (n >> 4) + 1;
}

// Decodes unit u (16 values) of a row: value k = q[k] * d + m.
template <QType kType>
__device__ __forceinline__ void decode_unit(const uint8_t* row, int64_t u, float* q, float* d,
                                            float* m) {
  if constexpr (kType == QType::Q4_1) {
    const uint8_t* b = row + (u / 2) * 20;
    const int shift = (u & 1) ? 4 : 0;  // low nibbles are values 0..15, high 16..31
    *d = ld_f16(b);
    *m = ld_f16(b + 2);
    const uint32_t* qs = reinterpret_cast<const uint32_t*>(b + 4);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t word = qs[w];
#pragma unroll
      for (int k = 0; k < 4; ++k) q[4 * w + k] = static_cast<float>((word >> (8 * k + shift)) & 0xF);
    }
  } else {  // Q8_0
    const uint8_t* b = row + (u / 2) * 34;
    *d = ld_f16(b);
    *m = 0.0f;
    // The 16 bytes in four words rather than sixteen byte loads (a warp's byte loads
    // cost as many memory transactions as its word loads). Rows start on an even address
    // (a device allocation, rows of 34-byte blocks), so the bytes are 4-aligned or 2 past
    // that (every other block): then two half-words and three words.
    const uint8_t* p = b + 2 + (u & 1) * 16;
    uint32_t w[4];
    if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) {
      const uint32_t* a = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = a[k];
    } else {
      const uint32_t lo = *reinterpret_cast<const uint16_t*>(p);
      const uint32_t* a = reinterpret_cast<const uint32_t*>(p + 2);
      const uint32_t a0 = a[0], a1 = a[1], a2 = a[2];
      const uint32_t hi = *reinterpret_cast<const uint16_t*>(p + 14);
      w[0] = lo | (a0 << 16);
      w[1] = (a0 >> 16) | (a1 << 16);
      w[2] = (a1 >> 16) | (a2 << 16);
      w[3] = (a2 >> 16) | (hi << 16);
    }
#pragma unroll
    for (int k = 0; k < 16; ++k)
      q[k] = static_cast<float>(static_cast<int8_t>((w[k / 4] >> (8 * (k % 4))) & 0xFF));
  }
}

// acc[tt] (tt < nt) += this lane's share of row · x[tt]; x points at row t0 of [T][n_in],
// or with kPadded, of T padded rows (padded_len(n_in) floats apart; padded_index).
template <QType kType, bool kPadded = false>
__device__ __forceinline__ void lane_row_dots(const uint8_t* row, int64_t n_in, const float* x,
                                              int nt, float* acc) {
  const int lane = threadIdx.x % 32;
  const int64_t units = n_in / 16;
  const int64_t stride = kPadded ? padded_len(n_in) : n_in;
  for (int64_t u = lane; u < units; u += 32) {
    float q[16], d, m;
    decode_unit<kType>(row, u, q, &d, &m);
#pragma unroll
    for (int tt = 0; tt < kRowsAtOnce; ++tt) {
      if (tt >= nt) break;
      const float* xs = x + int64_t(tt) * stride + (kPadded ? u * 17 : u * 16);
      float s = 0.0f, sx = 0.0f;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        s += q[k] * xs[k];
        sx += xs[k];
      }
      acc[tt] += d * s + m * sx;
    }
  }
}

// The same with the type chosen at run time (warp-uniform: one row per warp).
template <bool kPadded = false>
__device__ __forceinline__ void lane_row_dots_any(QType type, const uint8_t* row, int64_t n_in,
                                                  const float* x, int nt, float* acc) {
  if (type == QType::Q4_1)
    lane_row_dots<QType::Q4_1, kPadded>(row, n_in, x, nt, acc);
  else
    lane_row_dots<QType::Q8_0, kPadded>(row, n_in, x, nt, acc);
}

}  // namespace kvscope::cuda
