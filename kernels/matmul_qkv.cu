// matmul_qkv.cu — the three attention projections of a decode step in one launch.
// Thread mapping: one warp per output row, 8 warps per block, over the concatenated rows
// of Wq, Wk and Wv (row g < n_q is Wq's, then Wk's, then Wv's); a warp never straddles
// two matrices' work beyond its own row, and its matrix (and so its quant type branch)
// is warp-uniform. Per row: lanes stride over 16-value units (matvec_row.cuh), up to 4
// activation rows at a time, warp shuffle sum, lane 0 stores.
// Shapes: x [T][n_in] fp32; q [T][n_q], k [T][n_k], v [T][n_v] fp32.
#include "kernels/launch.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

// Shapes of the three matrices (index 0 q, 1 k, 2 v). The pointers travel as separate
// kernel arguments so the emulator's launch check sees every one of them.
struct QkvShape {
  int64_t row_bytes[3];
  int64_t n_out[3];
  QType type[3];
  int64_t n_in;
};

__global__ void __launch_bounds__(256)
    matmul_qkv_kernel(const uint8_t* wq, const uint8_t* wk, const uint8_t* wv, QkvShape a,
                      const float* x, int T, float* q, float* k, float* v) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  int64_t o = int64_t(blockIdx.x) * kMatvecWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Constant indices only (a dynamic index into the struct's arrays would put it in
  // local memory).
  int m = 0;
  if (o >= a.n_out[0]) {
    o -= a.n_out[0];
    m = 1;
    if (o >= a.n_out[1]) {
      o -= a.n_out[1];
      m = 2;
      if (o >= a.n_out[2]) return;  // past the last row: the whole warp leaves together
    }
  }
  const uint8_t* w = m == 0 ? wq : (m == 1 ? wk : wv);
  float* out = m == 0 ? q : (m == 1 ? k : v);
  const int64_t row_bytes = m == 0 ? a.row_bytes[0] : (m == 1 ? a.row_bytes[1] : a.row_bytes[2]);
  const int64_t n_out = m == 0 ? a.n_out[0] : (m == 1 ? a.n_out[1] : a.n_out[2]);
  const QType type = m == 0 ? a.type[0] : (m == 1 ? a.type[1] : a.type[2]);
  const uint8_t* row = w + o * row_bytes;
  for (int t0 = 0; t0 < T; t0 += kRowsAtOnce) {
    const int nt = T - t0 < kRowsAtOnce ? T - t0 : kRowsAtOnce;
    float acc[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots_any(type, row, a.n_in, x + int64_t(t0) * a.n_in, nt, acc);
    for (int tt = 0; tt < nt; ++tt) {
      const float sum = warp_sum(acc[tt]);
      if (lane == 0) out[int64_t(t0 + tt) * n_out + o] = sum;
    }
  }
}

}  // namespace

cudaError_t matmul_qkv(QMatrix wq, QMatrix wk, QMatrix wv, const float* x, int T, float* q,
                       float* k, float* v, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const QMatrix* ws[3] = {&wq, &wk, &wv};
  QkvShape a{};
  a.n_in = wq.n_in;
  int64_t rows = 0;
  for (int m = 0; m < 3; ++m) {
    const QMatrix& w = *ws[m];
    if (!matmul_native(w.type) || w.n_in != a.n_in || w.n_in % 32 != 0) return cudaErrorInvalidValue;
    a.row_bytes[m] = w.row_bytes;
    a.n_out[m] = w.n_out;
    a.type[m] = w.type;
    rows += w.n_out;
  }
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((rows + kMatvecWarpsPerBlock - 1) / kMatvecWarpsPerBlock));
  return launch(matmul_qkv_kernel, grid, dim3(32 * kMatvecWarpsPerBlock), 0, s,
                static_cast<const uint8_t*>(wq.data), static_cast<const uint8_t*>(wk.data),
                static_cast<const uint8_t*>(wv.data), a, x, T, q, k, v);
}

}  // namespace kvscope::cuda
