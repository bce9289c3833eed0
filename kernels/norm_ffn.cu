// norm_ffn.cu — a decode step's feed-forward half in one launch: the residual step
// (residual_norm.cuh), gate/up + activation, and the down product split over F.
// Thread mapping: 1024 threads; block b owns the 32 gate values f in [32b, 32b + 32):
// warp w computes row w of Wgate and of Wup (lanes over 16-value units, matvec_row.cuh),
// lane 0 keeps act(g)·u in shared memory; then thread i takes down rows i, i + 1024, ...:
// the dot of that row's 32 values of the slice (two units) with the slice's gate values,
// into partial[b][row]. The last block (last_block.cuh) sums the partials in slice order
// (deterministic: no float atomics), writes out, x and h. A decode step's latency is this
// chain (F/32 blocks: 48 for SmolLM2), so each block is as wide as a block can be: every
// row's loads are in flight at once, rather than four rows one after another per warp.
// Shapes: x, y, h, out [C]; w_gate, w_up [F][C]; w_down [C][F]; partial [F/32][C].
// The bodies are in norm_ffn.cuh.
#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"
#include "kernels/norm_ffn.cuh"
#include "kernels/residual_norm.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads)
    norm_ffn_kernel(ResidualArgs r, QMatrix wg, QMatrix wu, QMatrix wd, GateAct act, float* partial,
                    float* out, unsigned* counter) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  KVSCOPE_DYN_SMEM(float, xs);  // [C], then hs [padded_len(C)]
  float* hs = xs + r.C;
  __shared__ float g[kFfnSlice];
  __shared__ float scratch[32];
  __shared__ int last;
  residual_norm_block(r, xs, hs, scratch);
  norm_ffn_slice(wg, wu, wd, act, r.C, hs, blockIdx.x, g, partial);
  if (!last_block_to_arrive(counter, gridDim.x, &last)) return;
  // out may be y: every block, this one included, has read y already.
  for (int c = threadIdx.x; c < r.C; c += blockDim.x)
    out[c] = norm_ffn_sum(partial, gridDim.x, r.C, c);
  residual_norm_store(r, xs, hs);
}

}  // namespace

int64_t norm_ffn_work_floats(int64_t F, int64_t C) {
  return F / kFfnSlice * C;
}

cudaError_t norm_ffn(ResidualArgs r, QMatrix w_gate, QMatrix w_up, QMatrix w_down, GateAct act,
                     float* partial, float* out, unsigned* counter, cudaStream_t s) {
  const int64_t F = w_gate.n_out;
  if (!matmul_native(w_gate.type) || !matmul_native(w_up.type) || !matmul_native(w_down.type) ||
      r.C <= 0 || r.C % 32 != 0 || r.C > residual_norm_max_width() || w_gate.n_in != r.C ||
      w_up.n_in != r.C || w_up.n_out != F || F <= 0 || F % kFfnSlice != 0 || w_down.n_in != F ||
      w_down.n_out != r.C || partial == nullptr || counter == nullptr)
    return cudaErrorInvalidValue;
  const size_t smem = size_t(r.C + padded_len(r.C)) * sizeof(float);
  return launch(norm_ffn_kernel, dim3(static_cast<unsigned>(F / kFfnSlice)), dim3(kThreads), smem,
                s, r, w_gate, w_up, w_down, act, partial, out, counter);
}

}  // namespace kvscope::cuda
