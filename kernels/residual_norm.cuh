// residual_norm.cuh — the residual step that opens the fused decode-step kernels
// (norm_qkv_kv_write.cu, norm_ffn.cu), done by every block on its own so that no block
// waits for another: xs = x + y' (y' = RMSNorm(y)·y_norm, or y, or nothing), hs =
// RMSNorm(xs)·w, both in the block's shared memory: xs [C], and hs padded for the
// products' row dots (matvec_row.cuh: padded_len(C) floats, value i at padded_index(i)).
// The products then read hs; the last block writes xs and hs back (residual_norm_store),
// after every block has read x and y. Each thread handles the same strided values in
// every loop (no barrier between them but the reductions'); all threads must call it;
// blockDim.x a multiple of 32. Threads past kResidualNormThreads take the barriers and
// add nothing.
#pragma once

#include "kernels/kernels.h"
#include "kernels/matvec_row.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {

// The threads that take part in the residual step: at most this many, so that a wider
// block (norm_ffn.cu's 1024) sums the squares in the same order as the 256-thread one
// (norm_qkv_kv_write.cu) and every fused kernel sees the same h.
inline constexpr int kResidualNormThreads = 256;

__device__ __forceinline__ void residual_norm_block(const ResidualArgs& r, float* xs, float* hs,
                                                    float* scratch) {
  const int C = r.C;
  const float inv_c = 1.0f / static_cast<float>(C);
  const int threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int stride = threads < kResidualNormThreads ? threads : kResidualNormThreads;
  const int first = tid < stride ? tid : C;  // C: none
  if (r.y != nullptr) {
    float ss = 0.0f;
    for (int i = first; i < C; i += stride) {
      const float v = r.y[i];
      xs[i] = v;
      ss += v * v;
    }
    if (r.y_norm != nullptr) {  // Gemma's post norm of the product, before the add
      const float scale = rsqrtf(block_sum(ss, scratch) * inv_c + r.eps);
      for (int i = first; i < C; i += stride) xs[i] = xs[i] * scale * r.y_norm[i];
    }
    for (int i = first; i < C; i += stride) xs[i] = r.x[i] + xs[i];
  } else {
    for (int i = first; i < C; i += stride) xs[i] = r.x[i];
  }
  float ss = 0.0f;
  for (int i = first; i < C; i += stride) ss += xs[i] * xs[i];
  const float scale = rsqrtf(block_sum(ss, scratch) * inv_c + r.eps);
  for (int i = first; i < C; i += stride) hs[padded_index(i)] = xs[i] * scale * r.w[i];
  __syncthreads();  // hs complete for every warp's products
}

// The last block: x and h from shared memory (no other block reads them any more).
__device__ __forceinline__ void residual_norm_store(const ResidualArgs& r, const float* xs,
                                                    const float* hs) {
  for (int i = threadIdx.x; i < r.C; i += blockDim.x) {
    r.x[i] = xs[i];
    r.h[i] = hs[padded_index(i)];
  }
}

}  // namespace kvscope::cuda
