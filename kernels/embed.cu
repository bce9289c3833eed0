// embed.cu — token embedding gather with dequantization.
// Thread mapping: one block per token; threads stride over the C values of its row.
// Shapes: table {C, V} quantized (n_in = C, n_out = V), ids [T], out [T][C] fp32, every
// value times `scale` (Gemma's sqrt(C); 1 elsewhere, which is exact).
#include "kernels/launch.cuh"
#include "kernels/quant.cuh"

namespace kvscope::cuda {
namespace {

__global__ void embed_kernel(const uint8_t* table, QType type, int64_t row_bytes, int64_t C,
                             const int32_t* ids, float scale, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int t = blockIdx.x;
  const uint8_t* row = table + int64_t(ids[t]) * row_bytes;
  for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
    out[t * C + i] = dequant_value(type, row, i) * scale;
}

}  // namespace

cudaError_t embed(QMatrix table, const int32_t* ids, int T, float scale, float* out,
                  cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  return launch(embed_kernel, dim3(T), dim3(256), 0, s,
                static_cast<const uint8_t*>(table.data), table.type, table.row_bytes, table.n_in,
                ids, scale, out);
}

}  // namespace kvscope::cuda
