// add.cu — residual add, x += y.
// Thread mapping: grid-stride loop, one thread per element.
// Shapes: x, y [T][C] fp32 flattened to n.
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] += y[i];
}

}  // namespace

cudaError_t add(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  return launch(add_kernel, dim3(unsigned(blocks < 4096 ? blocks : 4096)), dim3(256), 0, s, x, y,
                n);
}

}  // namespace kvscope::cuda
