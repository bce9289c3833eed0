// add_rmsnorm.cu — residual add fused with the RMSNorm that follows it:
// x += y; out = x * rsqrt(mean(x^2) + eps) * w.
// Thread mapping: one block per row (token), min(1024, C rounded up to 32) threads (the
// same as rmsnorm.cu, so the sum of squares is reduced in the same order); each thread
// adds, stores and squares the values it strides over, a block reduction (warp
// shuffles + 32 floats of shared memory) gives the scale, and the same thread scales
// the values it wrote itself (no other thread's writes are read).
// Shapes: x, y, out [T][C] fp32 (out distinct from x and y), w [C] fp32.
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

__global__ void add_rmsnorm_kernel(float* x, const float* y, const float* w, int C, float eps,
                                   float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float scratch[32];
  float* xr = x + int64_t(blockIdx.x) * C;
  const float* yr = y + int64_t(blockIdx.x) * C;
  float* o = out + int64_t(blockIdx.x) * C;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float v = xr[i] + yr[i];
    xr[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float scale = rsqrtf(ss / static_cast<float>(C) + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

}  // namespace

cudaError_t add_rmsnorm(float* x, const float* y, const float* w, int T, int C, float eps,
                        float* out, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (C <= 0) return cudaErrorInvalidValue;
  const int threads = C >= 1024 ? 1024 : (C + 31) / 32 * 32;
  return launch(add_rmsnorm_kernel, dim3(T), dim3(threads), 0, s, x, y, w, C, eps, out);
}

}  // namespace kvscope::cuda
