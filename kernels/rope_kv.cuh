// rope_kv.cuh — device helpers shared by rope.cu, rope_kv_write.cu and kv_rerotate.cu, so
// the fused kernel rotates bit-identically to the separate ones (the cache stores are
// kv_quant.cuh's, shared with kv_write.cu).
//
// rope_cos_sin: the angle pos * freq_scale * base^(-2i/n_rot) is formed in double (at
// positions in the thousands a float angle would be off by ~1e-3 rad, which the CPU
// reference does not have); cos and sin are rounded to float. rope_pair: which two dims of
// a head form pair i (adjacent (2i, 2i+1) or NeoX (i, i + n_rot/2); past n_rot/2 the
// unrotated dims two at a time).
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

namespace kvscope::cuda {

__device__ __forceinline__ void rope_cos_sin(int pos, int i, const RopeArgs& r, float* c,
                                             float* s) {
  const double p = static_cast<double>(pos) * static_cast<double>(r.freq_scale);
  const double theta = p * pow(static_cast<double>(r.base), -2.0 * i / r.n_rot);
  *c = static_cast<float>(cos(theta));
  *s = static_cast<float>(sin(theta));
}

// Dims (a, b) of pair i in a head; b may be past the head for an odd D (then unused).
__device__ __forceinline__ void rope_pair(const RopeArgs& r, int i, int* a, int* b) {
  const int half = r.n_rot / 2;
  if (i < half) {
    *a = r.neox ? i : 2 * i;
    *b = r.neox ? i + half : 2 * i + 1;
  } else {
    *a = r.n_rot + 2 * (i - half);
    *b = *a + 1;
  }
}

// Rotates the pair (*a, *b) in place. The fused multiply-adds are explicit so every
// kernel that inlines this rounds the same way (left to the compiler, contraction of
// a*b - c*d differs between inlined copies under -march=native and under nvcc).
__device__ __forceinline__ void rope_rotate(float* a, float* b, float c, float s) {
  const float x0 = *a, x1 = *b;
  *a = fmaf(x0, c, -(x1 * s));
  *b = fmaf(x0, s, x1 * c);
}

}  // namespace kvscope::cuda
