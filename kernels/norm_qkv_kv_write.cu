// norm_qkv_kv_write.cu — a decode step's way in to attention in one launch: the residual
// step (residual_norm.cuh), the q/k/v products, and in the last block to finish the
// biases, per-head q/k norms, RoPE, the K/V store and the stored rows' norms.
// Thread mapping: 256 threads; every block forms h in shared memory, then one warp per
// output row over the concatenated rows of Wq, Wk, Wv (8 rows per block, as
// matmul_qkv.cu; lane 0 stores). The last block (last_block.cuh) writes x and h back,
// then runs rope_kv_write's one-token body (rope_kv_write.cuh) and kv_row_norms' body
// (kv_row_norms.cuh), so the results equal the unfused ops'. The bodies are in
// norm_qkv_kv_write.cuh.
// Shapes: x, y, h [C]; q [H*D], k, v [Hkv*D]; cache K, V rows at the position's slot.
#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"
#include "kernels/norm_qkv_kv_write.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 32 * kMatvecWarpsPerBlock;
constexpr int kMaxWidth = 4096;  // C + padded_len(C) floats of dynamic shared memory: 33 KiB

template <class KE, class VE>
__global__ void __launch_bounds__(kThreads)
    norm_qkv_kernel(ResidualArgs r, QMatrix wq, QMatrix wk, QMatrix wv, QkvPost p, float* q,
                    float* k, float* v, KvLayer kv, unsigned* counter, uint8_t* kc, uint8_t* vc) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  KVSCOPE_DYN_SMEM(float, xs);  // [C], then hs [padded_len(C)]
  float* hs = xs + r.C;
  __shared__ float scratch[32];
  __shared__ int last;
  residual_norm_block(r, xs, hs, scratch);
  // A warp past the end does no product but still arrives.
  norm_qkv_row(wq, wk, wv, r.C, hs, q, k, v,
               int64_t(blockIdx.x) * kMatvecWarpsPerBlock + threadIdx.x / 32);
  if (!last_block_to_arrive(counter, gridDim.x, &last)) return;
  norm_qkv_epilogue<KE, VE>(r, xs, hs, p, q, k, v, kv, kc, vc, scratch);
}

}  // namespace

int residual_norm_max_width() {
  return kMaxWidth;
}

cudaError_t norm_qkv_kv_write(ResidualArgs r, QMatrix wq, QMatrix wk, QMatrix wv, QkvPost p,
                              float* q, float* k, float* v, KvLayer kv, unsigned* counter,
                              cudaStream_t s) {
  const QMatrix* ws[3] = {&wq, &wk, &wv};
  for (const QMatrix* w : ws)
    if (!matmul_native(w->type) || w->n_in != r.C) return cudaErrorInvalidValue;
  if (r.C <= 0 || r.C % 32 != 0 || r.C > kMaxWidth || counter == nullptr || p.H <= 0 ||
      p.rope.n_rot < 0 || p.rope.n_rot % 2 != 0 || p.rope.n_rot > kv.head_dim ||
      kv.n_head_kv <= 0 || kv.pos == nullptr || (kv.blocks == nullptr && kv.n_slots <= kv.sink) ||
      wq.n_out != int64_t(p.H) * kv.head_dim || wk.n_out != int64_t(kv.n_head_kv) * kv.head_dim ||
      wv.n_out != wk.n_out)
    return cudaErrorInvalidValue;
  const int64_t rows = wq.n_out + wk.n_out + wv.n_out;
  const dim3 grid(static_cast<unsigned>((rows + kMatvecWarpsPerBlock - 1) / kMatvecWarpsPerBlock));
  const size_t smem = size_t(r.C + padded_len(r.C)) * sizeof(float);
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(norm_qkv_kernel<KE, VE>, grid, dim3(kThreads), smem, s, r, wq, wk, wv, p, q, k, v,
                  kv, counter, static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v));
  });
}

}  // namespace kvscope::cuda
