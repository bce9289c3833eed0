// matmul_glu.cu — the gated front half of the feed-forward block in one launch:
// out = act(Wgate·x) * (Wup·x), act SiLU or tanh-GELU (act.cuh).
// Thread mapping: one warp per output column o (8 warps per block): the warp computes
// its lanes' shares of gate row o and of up row o over the same activation rows (up to
// 4 at a time, matvec_row.cuh), reduces both with shuffles, and lane 0 writes the
// product. Neither gate nor up ever goes to memory.
// Shapes: w_gate, w_up {n_in, F}; x [T][n_in] fp32; out [T][F] fp32.
#include "kernels/act.cuh"
#include "kernels/launch.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

__global__ void __launch_bounds__(256)
    matmul_glu_kernel(const uint8_t* wg, QType tg, int64_t rb_g, const uint8_t* wu, QType tu,
                       int64_t rb_u, int64_t n_in, int64_t F, const float* x, int T, GateAct act,
                       float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t o = int64_t(blockIdx.x) * kMatvecWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (o >= F) return;  // whole warp leaves together
  const uint8_t* rg = wg + o * rb_g;
  const uint8_t* ru = wu + o * rb_u;
  for (int t0 = 0; t0 < T; t0 += kRowsAtOnce) {
    const int nt = T - t0 < kRowsAtOnce ? T - t0 : kRowsAtOnce;
    float ag[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    float au[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float* xs = x + int64_t(t0) * n_in;
    lane_row_dots_any(tg, rg, n_in, xs, nt, ag);
    lane_row_dots_any(tu, ru, n_in, xs, nt, au);
    for (int tt = 0; tt < nt; ++tt) {
      const float g = warp_sum(ag[tt]);
      const float u = warp_sum(au[tt]);
      if (lane == 0) out[int64_t(t0 + tt) * F + o] = gate_act(act, g) * u;
    }
  }
}

}  // namespace

cudaError_t matmul_glu(QMatrix w_gate, QMatrix w_up, const float* x, int T,
                               GateAct act, float* out, cudaStream_t s) {
  if (T <= 0 || w_gate.n_out == 0) return cudaSuccess;
  if (!matmul_native(w_gate.type) || !matmul_native(w_up.type) || w_gate.n_in != w_up.n_in ||
      w_gate.n_out != w_up.n_out || w_gate.n_in % 32 != 0)
    return cudaErrorInvalidValue;
  const int64_t F = w_gate.n_out;
  const dim3 grid(static_cast<unsigned>((F + kMatvecWarpsPerBlock - 1) / kMatvecWarpsPerBlock));
  return launch(matmul_glu_kernel, grid, dim3(32 * kMatvecWarpsPerBlock), 0, s,
                static_cast<const uint8_t*>(w_gate.data), w_gate.type, w_gate.row_bytes,
                static_cast<const uint8_t*>(w_up.data), w_up.type, w_up.row_bytes, w_gate.n_in,
                F, x, T, act, out);
}

}  // namespace kvscope::cuda
