// rope_kv_write.cu — RoPE on q and k plus the KV-cache store, one launch per step.
// Thread mapping: one block per token t, two phases. 1: its threads stride over the
// (head, pair) items of q and then the (kv head, pair) items of k (pairs as rope_pair
// numbers them, adjacent or NeoX; only pairs below n_rot/2 rotate), each rotated in
// place by exactly one thread. A barrier publishes the rotated k. 2: its warps stride
// over the 32-value chunks of every kv head's k and v rows and store them into the cache
// in its types (kernels/kv_quant.cuh: one warp per q8_0 / q4_0 block). Rotation and
// conversion come from rope_kv.cuh and kv_quant.cuh: results equal rope() + rope() +
// kv_write(). Lane 0 of thread 0's warp records the position in the slot map.
// rope_kv_write_rows: the same for B decode rows of different sequences, one block each.
// Shapes: q [T][H*D], k, v [T][Hkv*D] fp32; cache K, V [Hkv][n_slots] rows at the slot of
// position pos0 + t (kernels/kv_layout.cuh).
#include "kernels/launch.cuh"
#include "kernels/rope_kv_write.cuh"

namespace kvscope::cuda {
namespace {

template <class KE, class VE>
__global__ void rope_kv_write_kernel(float* q, float* k, const float* v, int H, RopeArgs rp,
                                     KvLayer kv, int pos0, const int* pos0_dev, uint8_t* kc,
                                     uint8_t* vc) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int t = blockIdx.x;
  const int pos = (pos0_dev != nullptr ? *pos0_dev : pos0) + t;
  rope_kv_write_token<KE, VE>(q, k, v, H, rp, kv, t, pos, kc, vc);
}

// Decode rows of several sequences: block b is row b, at rows[b].query, stored through
// rows[b]'s own block table and slot map (the other fields are the layer's, shared).
template <class KE, class VE>
__global__ void rope_kv_write_rows_kernel(float* q, float* k, const float* v, int H, RopeArgs rp,
                                          KvLayer kv, const KvRowRef* rows, uint8_t* kc,
                                          uint8_t* vc) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int b = blockIdx.x;
  const KvRowRef r = rows[b];
  KvLayer kl = kv;
  kl.blocks = r.blocks;
  kl.pos = r.pos;
  kl.n_slots = r.n_slots;
  rope_kv_write_token<KE, VE>(q, k, v, H, rp, kl, b, r.query, kc, vc);
}

int rope_kv_threads(int n_head, RopeArgs r, const KvLayer& kv) {
  // One rotation per thread at decode, and at least one warp per stored chunk up to 512.
  const int rot = (n_head + kv.n_head_kv) * (r.n_rot / 2);
  const int store = 2 * kv.n_head_kv * ((kv.head_dim + 31) / 32) * 32;
  const int work = rot > store ? rot : store;
  return work >= 512 ? 512 : (work + 31) / 32 * 32;
}

}  // namespace

cudaError_t rope_kv_write(float* q, float* k, const float* v, int T, int n_head, RopeArgs r,
                          KvLayer kv, int pos0, const int* pos0_dev, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > kv.head_dim || n_head <= 0 ||
      kv.n_head_kv <= 0 || kv.pos == nullptr || (kv.blocks == nullptr && kv.n_slots <= kv.sink))
    return cudaErrorInvalidValue;
  const int threads = rope_kv_threads(n_head, r, kv);
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(rope_kv_write_kernel<KE, VE>, dim3(T), dim3(threads), 0, s, q, k, v, n_head, r,
                  kv, pos0, pos0_dev, static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v));
  });
}

cudaError_t rope_kv_write_rows(float* q, float* k, const float* v, int B, int n_head, RopeArgs r,
                               KvLayer kv, const KvRowRef* rows, cudaStream_t s) {
  if (B <= 0) return cudaSuccess;
  if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > kv.head_dim || n_head <= 0 ||
      kv.n_head_kv <= 0 || kv.block <= 0 || rows == nullptr)
    return cudaErrorInvalidValue;
  const int threads = rope_kv_threads(n_head, r, kv);
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(rope_kv_write_rows_kernel<KE, VE>, dim3(B), dim3(threads), 0, s, q, k, v, n_head,
                  r, kv, rows, static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v));
  });
}

}  // namespace kvscope::cuda
