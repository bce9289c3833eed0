// matmul.cu — quantized matrix times a few activation rows (decode and short prefill).
// Thread mapping: one warp per output row o, 8 warps per block; lanes stride over
// 16-value units of the row (half a Q4_1/Q8_0 block), decode them once per unit and
// dot them with up to 4 activation rows at a time; a warp shuffle sum per row of x. The
// block first copies x into shared memory, padded (matvec_row.cuh), when it fits: the
// lanes' reads of 16 consecutive values each then take one pass of the banks instead of
// sixteen cache-line reads.
// The fp32 variant strides lanes over single values of a dequantized fp32 copy.
// Shapes: w {n_in, n_out} (n_out rows), x [T][n_in] fp32, out [T][n_out] fp32.
#include "kernels/launch.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kWarpsPerBlock = kMatvecWarpsPerBlock;
constexpr size_t kStagedMaxBytes = 48 * 1024;

template <QType kType, bool kStaged>
__global__ void __launch_bounds__(256)
    matmul_kernel(const uint8_t* w, int64_t row_bytes, int64_t n_in, int64_t n_out, const float* x,
                  int T, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const float* xr = x;  // the activations the lanes read: global, or staged and padded
  int64_t x_stride = n_in;
  if constexpr (kStaged) {
    KVSCOPE_DYN_SMEM(float, xsm);  // [T][padded_len(n_in)]
    x_stride = padded_len(n_in);
    for (int64_t i = threadIdx.x; i < int64_t(T) * n_in; i += blockDim.x)
      xsm[(i / n_in) * x_stride + padded_index(i % n_in)] = x[i];
    __syncthreads();
    xr = xsm;
  }
  const int64_t o = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= n_out) return;  // whole warp leaves together
  const uint8_t* row = w + o * row_bytes;
  for (int t0 = 0; t0 < T; t0 += kRowsAtOnce) {
    const int nt = T - t0 < kRowsAtOnce ? T - t0 : kRowsAtOnce;
    float acc[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots<kType, kStaged>(row, n_in, xr + int64_t(t0) * x_stride, nt, acc);
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

template <QType kType>
cudaError_t launch_matmul(QMatrix w, const float* x, int T, float* out, cudaStream_t s) {
  const auto* data = static_cast<const uint8_t*>(w.data);
  const dim3 block(32 * kWarpsPerBlock);
  // The activations go through shared memory, padded, when they fit the default 48 KiB.
  const size_t staged = size_t(T) * size_t(padded_len(w.n_in)) * sizeof(float);
  if (staged <= kStagedMaxBytes)
    return launch(matmul_kernel<kType, true>, grid_rows(w.n_out), block, staged, s, data,
                  w.row_bytes, w.n_in, w.n_out, x, T, out);
  return launch(matmul_kernel<kType, false>, grid_rows(w.n_out), block, 0, s, data, w.row_bytes,
                w.n_in, w.n_out, x, T, out);
}

}  // namespace

cudaError_t matmul(QMatrix w, const float* x, int T, float* out, cudaStream_t s) {
  if (T <= 0 || w.n_out == 0) return cudaSuccess;
  if (w.n_in % 32 != 0) return cudaErrorInvalidValue;
  switch (w.type) {
    case QType::Q4_1:
      return launch_matmul<QType::Q4_1>(w, x, T, out, s);
    case QType::Q8_0:
      return launch_matmul<QType::Q8_0>(w, x, T, out, s);
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
