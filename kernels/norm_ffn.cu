// norm_ffn.cu — a decode step's feed-forward half in one launch: the residual step
// (residual_norm.cuh), gate/up + activation, and the down product split over F.
// Thread mapping: 256 threads; block b owns the 32 gate values f in [32b, 32b + 32):
// warp w computes rows w, w + 8, ... of Wgate and Wup (lanes over 16-value units,
// matvec_row.cuh), lane 0 keeps act(g)·u in shared memory; then thread i takes down rows
// i, i + 256, ...: the dot of that row's 32 values of the slice (two units) with the
// slice's gate values, into partial[b][row]. The last block (last_block.cuh) sums the
// partials in slice order (deterministic: no float atomics), writes out, x and h.
// Shapes: x, y, h, out [C]; w_gate, w_up [F][C]; w_down [C][F]; partial [F/32][C].
#include "kernels/act.cuh"
#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/residual_norm.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 32 * kMatvecWarpsPerBlock;
constexpr int kSlice = 32;

// Units u0, u0 + 1 (32 values) of a row · g [32].
template <QType kType>
__device__ __forceinline__ float slice_dot(const uint8_t* row, int64_t u0, const float* g) {
  float acc = 0.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float qv[16], d, m;
    decode_unit<kType>(row, u0 + h, qv, &d, &m);
    float s = 0.0f, sx = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      s += qv[k] * g[16 * h + k];
      sx += g[16 * h + k];
    }
    acc += d * s + m * sx;
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads)
    norm_ffn_kernel(ResidualArgs r, QMatrix wg, QMatrix wu, QMatrix wd, GateAct act, float* partial,
                    float* out, unsigned* counter) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  KVSCOPE_DYN_SMEM(float, xs);  // [C], then hs [C]
  float* hs = xs + r.C;
  __shared__ float g[kSlice];
  __shared__ float scratch[32];
  __shared__ int last;
  residual_norm_block(r, xs, hs, scratch);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t f0 = int64_t(blockIdx.x) * kSlice;
  for (int i = warp; i < kSlice; i += kMatvecWarpsPerBlock) {
    float ag[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    float au[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots_any(wg.type, static_cast<const uint8_t*>(wg.data) + (f0 + i) * wg.row_bytes, r.C,
                      hs, 1, ag);
    lane_row_dots_any(wu.type, static_cast<const uint8_t*>(wu.data) + (f0 + i) * wu.row_bytes, r.C,
                      hs, 1, au);
    const float gs = warp_sum(ag[0]);
    const float us = warp_sum(au[0]);
    if (lane == 0) g[i] = gate_act(act, gs) * us;
  }
  __syncthreads();
  const int64_t u0 = f0 / 16;
  const auto* wdd = static_cast<const uint8_t*>(wd.data);
  for (int c = threadIdx.x; c < r.C; c += blockDim.x) {
    const uint8_t* row = wdd + int64_t(c) * wd.row_bytes;
    partial[int64_t(blockIdx.x) * r.C + c] = wd.type == QType::Q4_1
                                                 ? slice_dot<QType::Q4_1>(row, u0, g)
                                                 : slice_dot<QType::Q8_0>(row, u0, g);
  }
  if (!last_block_to_arrive(counter, gridDim.x, &last)) return;
  // out may be y: every block, this one included, has read y already.
  for (int c = threadIdx.x; c < r.C; c += blockDim.x) {
    float s = 0.0f;
    for (unsigned b = 0; b < gridDim.x; ++b) s += partial[int64_t(b) * r.C + c];
    out[c] = s;
  }
  residual_norm_store(r, xs, hs);
}

}  // namespace

int64_t norm_ffn_work_floats(int64_t F, int64_t C) {
  return F / kSlice * C;
}

cudaError_t norm_ffn(ResidualArgs r, QMatrix w_gate, QMatrix w_up, QMatrix w_down, GateAct act,
                     float* partial, float* out, unsigned* counter, cudaStream_t s) {
  const int64_t F = w_gate.n_out;
  if (!matmul_native(w_gate.type) || !matmul_native(w_up.type) || !matmul_native(w_down.type) ||
      r.C <= 0 || r.C % 32 != 0 || r.C > residual_norm_max_width() || w_gate.n_in != r.C ||
      w_up.n_in != r.C || w_up.n_out != F || F <= 0 || F % kSlice != 0 || w_down.n_in != F ||
      w_down.n_out != r.C || partial == nullptr || counter == nullptr)
    return cudaErrorInvalidValue;
  const size_t smem = size_t(2) * r.C * sizeof(float);
  return launch(norm_ffn_kernel, dim3(static_cast<unsigned>(F / kSlice)), dim3(kThreads), smem, s,
                r, w_gate, w_up, w_down, act, partial, out, counter);
}

}  // namespace kvscope::cuda
