// add_bias.cu — bias add after a projection (Qwen2's q, k, v): x[t][i] += b[i].
// Thread mapping: grid-stride loop, one thread per element.
// Shapes: x [T][n] fp32, b [n] fp32.
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

__global__ void add_bias_kernel(float* x, const float* b, int64_t total, int64_t n) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    x[i] += b[i % n];
}

}  // namespace

cudaError_t add_bias(float* x, const float* b, int T, int64_t n, cudaStream_t s) {
  const int64_t total = int64_t(T) * n;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  return launch(add_bias_kernel, dim3(unsigned(blocks < 4096 ? blocks : 4096)), dim3(256), 0, s, x,
                b, total, n);
}

}  // namespace kvscope::cuda
