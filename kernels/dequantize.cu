// dequantize.cu — quantized matrix to fp32 (the copy cuBLAS and the fp32 matvec read for
// types without a native kernel, so activations and weights stay fp32 in every product).
// Thread mapping: grid-stride loop, one thread per output value.
// Shapes: w {n_in, n_out} quantized -> out [n_out][n_in] fp32 (the exact dequantized values).
#include "kernels/launch.cuh"
#include "kernels/quant.cuh"

namespace kvscope::cuda {
namespace {

__global__ void dequantize_f32_kernel(const uint8_t* w, QType type, int64_t row_bytes,
                                      int64_t n_in, int64_t total, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t r = e / n_in, i = e % n_in;
    out[e] = dequant_value(type, w + r * row_bytes, i);
  }
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

cudaError_t dequantize_f32(QMatrix w, float* out, cudaStream_t s) {
  const int64_t total = w.n_in * w.n_out;
  if (total == 0) return cudaSuccess;
  return launch(dequantize_f32_kernel, dim3(grid_for(total, 256)), dim3(256), 0, s,
                static_cast<const uint8_t*>(w.data), w.type, w.row_bytes, w.n_in, total, out);
}

}  // namespace kvscope::cuda
