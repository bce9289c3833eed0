// rope_kv.cuh — device helpers shared by rope.cu, kv_append.cu and rope_kv_write.cu, so
// the fused kernel rotates and stores bit-identically to the separate ones.
//
// rope_cos_sin: the angle pos * base^(-2i/n_rot) is formed in double (at positions in
// the thousands a float angle would be off by ~1e-3 rad, which the CPU reference does
// not have); cos and sin are rounded to float. to_cache converts an fp32 value to the
// cache dtype (round to nearest for fp16).
#pragma once

#include "kernels/cuda_compat.cuh"

namespace kvscope_cuda {

__device__ __forceinline__ void rope_cos_sin(int pos, int i, int n_rot, float base, float* c,
                                             float* s) {
  const double theta = static_cast<double>(pos) * pow(static_cast<double>(base), -2.0 * i / n_rot);
  *c = static_cast<float>(cos(theta));
  *s = static_cast<float>(sin(theta));
}

// Rotates the pair (v[0], v[1]) in place. The fused multiply-adds are explicit so every
// kernel that inlines this rounds the same way (left to the compiler, contraction of
// a*b - c*d differs between inlined copies under -march=native and under nvcc).
__device__ __forceinline__ void rope_rotate(float* v, float c, float s) {
  const float x0 = v[0], x1 = v[1];
  v[0] = fmaf(x0, c, -(x1 * s));
  v[1] = fmaf(x0, s, x1 * c);
}

template <class KT>
__device__ __forceinline__ KT to_cache(float f);
template <>
__device__ __forceinline__ __half to_cache<__half>(float f) {
  return __float2half_rn(f);
}
template <>
__device__ __forceinline__ float to_cache<float>(float f) {
  return f;
}

}  // namespace kvscope_cuda
