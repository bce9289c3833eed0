// norm_ffn.cuh — the bodies of the fused feed-forward half (norm_ffn.cu): one gate slice
// of 32 values through gate/up + activation and its partial down product
// (norm_ffn_slice), and one output value's sum of the partials in slice order
// (norm_ffn_sum, deterministic: no float atomics).
// Thread mapping: any whole number of warps (norm_ffn.cu: 32, one gate/up row pair each);
// warp w computes rows w, w + warps, ... of the slice's Wgate and Wup rows, lane 0 keeps
// act(g)·u in g (32 floats of shared memory); then thread i takes down rows i,
// i + blockDim.x, ...
// Shapes: h [C] (hs padded: residual_norm.cuh); w_gate, w_up [F][C]; w_down [C][F];
// partial [F/32][C].
#pragma once

#include "kernels/act.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {

inline constexpr int kFfnSlice = 32;

// Units u0, u0 + 1 (32 values) of a row · g [32].
template <QType kType>
__device__ __forceinline__ float ffn_slice_dot(const uint8_t* row, int64_t u0, const float* g) {
  float acc = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float qv[16], d, m;
    decode_unit<kType>(row, u0 + h, qv, &d, &m);
    float s = 0.0f, sx = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      s += qv[k] * g[16 * h + k];
      sx += g[16 * h + k];
    }
    acc += d * s + m * sx;
  }
  return acc;
}

// Slice `slice` (gate values [32 slice, 32 slice + 32)): g, then partial[slice][c] for every
// c. Every thread of the block must call it (it holds a barrier); g may be rewritten only
// after a further barrier.
__device__ __forceinline__ void norm_ffn_slice(const QMatrix& wg, const QMatrix& wu,
                                               const QMatrix& wd, GateAct act, int C,
                                               const float* hs, int64_t slice, float* g,
                                               float* partial) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  const int64_t f0 = slice * kFfnSlice;
  for (int i = warp; i < kFfnSlice; i += warps) {
    float ag[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    float au[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots_any<true>(wg.type, static_cast<const uint8_t*>(wg.data) + (f0 + i) * wg.row_bytes,
                            C, hs, 1, ag);
    lane_row_dots_any<true>(wu.type, static_cast<const uint8_t*>(wu.data) + (f0 + i) * wu.row_bytes,
                            C, hs, 1, au);
    const float gs = warp_sum(ag[0]);
    const float us = warp_sum(au[0]);
    if (lane == 0) g[i] = gate_act(act, gs) * us;
  }
  __syncthreads();
  const int64_t u0 = f0 / 16;
  const auto* wdd = static_cast<const uint8_t*>(wd.data);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const uint8_t* row = wdd + int64_t(c) * wd.row_bytes;
    partial[slice * C + c] = wd.type == QType::Q4_1 ? ffn_slice_dot<QType::Q4_1>(row, u0, g)
                                                    : ffn_slice_dot<QType::Q8_0>(row, u0, g);
  }
}

// Output value c: the partials of the n_slices slices summed in slice order.
__device__ __forceinline__ float norm_ffn_sum(const float* partial, unsigned n_slices, int C,
                                              int c) {
  // Eight loads in flight at a time, added in slice order.
  float s = 0.0f;
  unsigned b = 0;
  for (; b + 8 <= n_slices; b += 8) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = partial[int64_t(b + j) * C + c];
#pragma unroll
    for (int j = 0; j < 8; ++j) s += v[j];
  }
  for (; b < n_slices; ++b) s += partial[int64_t(b) * C + c];
  return s;
}

}  // namespace kvscope::cuda
