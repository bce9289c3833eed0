// rmsnorm.cu — RMSNorm with a learned scale.
// Thread mapping: one block per row (token); threads stride over C, block reduction of
// the sum of squares (warp shuffles + 32 floats of shared memory).
// Shapes: x, out [T][C] fp32 (out may alias x), w [C] fp32.
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

__global__ void rmsnorm_kernel(const float* x, const float* w, int C, float eps, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float scratch[32];
  const float* xr = x + int64_t(blockIdx.x) * C;
  float* o = out + int64_t(blockIdx.x) * C;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, scratch);
  const float scale = rsqrtf(ss / static_cast<float>(C) + eps);
  // Each thread rewrites only the values it read, after the reduction: aliasing is safe.
  for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

}  // namespace

cudaError_t rmsnorm(const float* x, const float* w, int T, int C, float eps, float* out,
                    cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const int threads = C >= 1024 ? 1024 : (C + 31) / 32 * 32;
  return launch(rmsnorm_kernel, dim3(T), dim3(threads), 0, s, x, w, C, eps, out);
}

}  // namespace kvscope::cuda
