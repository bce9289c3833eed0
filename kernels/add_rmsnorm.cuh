// add_rmsnorm.cuh — add_rmsnorm.cu's row (x += y; out = x * rsqrt(mean(x^2) + eps) * w) by
// a block of any size computing exactly what add_rmsnorm's kernel computes with its own
// block of add_rmsnorm_threads(C) threads: the persistent decode step (256 threads) runs
// the final norm with it and stays bit-identical to the graphed path.
// How: "virtual thread" t < V sums the squares of the values t, t + V, ... as thread t of
// the V-thread block would; each virtual warp's 32 partials go through warp_sum (the same
// shuffle tree), and the virtual warps' sums through one more warp_sum as in block_sum.
// vss: V floats of shared memory, vws: 32 floats; blockDim.x a multiple of 32.
#pragma once

#include "kernels/reduce.cuh"

namespace kvscope::cuda {

// add_rmsnorm.cu's block size for rows of C values.
__host__ __device__ inline int add_rmsnorm_threads(int C) {
  return C >= 1024 ? 1024 : (C + 31) / 32 * 32;
}

__device__ __forceinline__ void add_rmsnorm_row_as_block(float* x, const float* y, const float* w,
                                                         int C, float eps, float* out, float* vss,
                                                         float* vws) {
  const int V = add_rmsnorm_threads(C), n_vw = V / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int t = threadIdx.x; t < V; t += blockDim.x) {
    float ss = 0.0f;
    for (int i = t; i < C; i += V) {
      const float v = x[i] + y[i];
      x[i] = v;
      ss += v * v;
    }
    vss[t] = ss;
  }
  __syncthreads();
  for (int vw = warp; vw < n_vw; vw += blockDim.x / 32) {  // warp-uniform
    const float s = warp_sum(vss[vw * 32 + lane]);
    if (lane == 0) vws[vw] = s;
  }
  __syncthreads();
  const float ss = warp_sum(lane < n_vw ? vws[lane] : 0.0f);
  const float scale = rsqrtf(ss / static_cast<float>(C) + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x) out[i] = x[i] * scale * w[i];
}

}  // namespace kvscope::cuda
