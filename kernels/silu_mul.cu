// silu_mul.cu — SwiGLU gate: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
// Thread mapping: grid-stride loop, one thread per element.
// Shapes: gate, up, out [T][F] fp32 flattened to n; out may alias gate.
#include "kernels/launch.cuh"

namespace kvscope_cuda {
namespace {

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = gate[i];
    out[i] = g / (1.0f + __expf(-g)) * up[i];
  }
}

}  // namespace

cudaError_t silu_mul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  return launch(silu_mul_kernel, dim3(unsigned(blocks < 4096 ? blocks : 4096)), dim3(256), 0, s,
                gate, up, n, out);
}

}  // namespace kvscope_cuda
