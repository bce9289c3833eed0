// dequantize.cu — quantized matrix to fp16 (for cuBLAS and the fp16 matvec), and fp32
// activations to fp16 (the cuBLAS B operand).
// Thread mapping: grid-stride loop, one thread per output value.
// Shapes: w {n_in, n_out} quantized -> out [n_out][n_in] fp16; x [n] -> out [n] fp16.
#include "kernels/launch.cuh"
#include "kernels/quant.cuh"

namespace kvscope_cuda {
namespace {

__global__ void dequantize_f16_kernel(const uint8_t* w, QType type, int64_t row_bytes,
                                      int64_t n_in, int64_t total, __half* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t r = e / n_in, i = e % n_in;
    out[e] = __float2half_rn(dequant_value(type, w + r * row_bytes, i));
  }
}

__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = __float2half_rn(x[e]);
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

cudaError_t dequantize_f16(QMatrix w, __half* out, cudaStream_t s) {
  const int64_t total = w.n_in * w.n_out;
  if (total == 0) return cudaSuccess;
  return launch(dequantize_f16_kernel, dim3(grid_for(total, 256)), dim3(256), 0, s,
                static_cast<const uint8_t*>(w.data), w.type, w.row_bytes, w.n_in, total, out);
}

cudaError_t to_f16(const float* x, int64_t n, __half* out, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return launch(to_f16_kernel, dim3(grid_for(n, 256)), dim3(256), 0, s, x, n, out);
}

}  // namespace kvscope_cuda
