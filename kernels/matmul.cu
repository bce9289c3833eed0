// matmul.cu — quantized matrix times a few activation rows (decode and short prefill).
// Thread mapping: one warp per output row o, 8 warps per block; lanes stride over
// 16-value units of the row (half a Q4_1/Q8_0 block), decode them once per unit and
// dot them with up to 4 activation rows at a time; a warp shuffle sum per row of x.
// The fp32 variant strides lanes over single values of a dequantized fp32 copy.
// Shapes: w {n_in, n_out} (n_out rows), x [T][n_in] fp32, out [T][n_out] fp32.
#include "kernels/launch.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kWarpsPerBlock = kMatvecWarpsPerBlock;

template <QType kType>
__global__ void __launch_bounds__(256)
    matmul_kernel(const uint8_t* w, int64_t row_bytes, int64_t n_in, int64_t n_out,
                    const float* x, int T, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= n_out) return;  // whole warp leaves together
  const uint8_t* row = w + o * row_bytes;
  for (int t0 = 0; t0 < T; t0 += kRowsAtOnce) {
    const int nt = T - t0 < kRowsAtOnce ? T - t0 : kRowsAtOnce;
    float acc[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots<kType>(row, n_in, x + int64_t(t0) * n_in, nt, acc);
    for (int tt = 0; tt < nt; ++tt) {
      const float v = warp_sum(acc[tt]);
      if (lane == 0) out[int64_t(t0 + tt) * n_out + o] = v;
    }
  }
}

__global__ void __launch_bounds__(256)
    matmul_f32_kernel(const float* w, int64_t n_in, int64_t n_out, const float* x, int T,
                      float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= n_out) return;
  const float* row = w + o * n_in;
  for (int t0 = 0; t0 < T; t0 += kRowsAtOnce) {
    const int nt = T - t0 < kRowsAtOnce ? T - t0 : kRowsAtOnce;
    float acc[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = lane; i < n_in; i += 32) {
      const float wv = row[i];
#pragma unroll
      for (int tt = 0; tt < kRowsAtOnce; ++tt)
        if (tt < nt) acc[tt] += wv * x[int64_t(t0 + tt) * n_in + i];
    }
    for (int tt = 0; tt < nt; ++tt) {
      const float v = warp_sum(acc[tt]);
      if (lane == 0) out[int64_t(t0 + tt) * n_out + o] = v;
    }
  }
}

dim3 grid_rows(int64_t n_out) {
  return dim3(static_cast<unsigned>((n_out + kWarpsPerBlock - 1) / kWarpsPerBlock));
}

}  // namespace

cudaError_t matmul(QMatrix w, const float* x, int T, float* out, cudaStream_t s) {
  if (T <= 0 || w.n_out == 0) return cudaSuccess;
  if (w.n_in % 32 != 0) return cudaErrorInvalidValue;
  const auto* data = static_cast<const uint8_t*>(w.data);
  const dim3 block(32 * kWarpsPerBlock);
  switch (w.type) {
    case QType::Q4_1:
      return launch(matmul_kernel<QType::Q4_1>, grid_rows(w.n_out), block, 0, s, data,
                    w.row_bytes, w.n_in, w.n_out, x, T, out);
    case QType::Q8_0:
      return launch(matmul_kernel<QType::Q8_0>, grid_rows(w.n_out), block, 0, s, data,
                    w.row_bytes, w.n_in, w.n_out, x, T, out);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t matmul_f32(const float* w32, int64_t n_in, int64_t n_out, const float* x, int T,
                       float* out, cudaStream_t s) {
  if (T <= 0 || n_out == 0) return cudaSuccess;
  return launch(matmul_f32_kernel, grid_rows(n_out), dim3(32 * kWarpsPerBlock), 0, s, w32, n_in,
                n_out, x, T, out);
}

}  // namespace kvscope::cuda
