// rope_kv_write.cu — RoPE on q and k plus the KV-cache store, one launch per step.
// Thread mapping: one block per token t; its threads stride over a flat work list:
// first the (head, pair) items of q (rotated in place), then the (kv head, pair) items
// of k/v (pairs as rope_pair numbers them, adjacent or NeoX): pairs below n_rot/2 rotate
// k in place, every pair stores its two values of k and v (the second only when it
// exists, for odd D) into the cache. Each item is owned by exactly one thread (the pairs
// of a head cover each dim once), so no barrier is needed. Rotation and
// conversion come from rope_kv.cuh: results equal rope() + rope() + kv_append().
// The item (kv head 0, pair 0) of each token also records the position in the slot map.
// Shapes: q [T][H*D], k, v [T][Hkv*D] fp32; cache K, V [Hkv][n_slots][D] at the slot of
// position pos0 + t (kernels/kv_layout.cuh).
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope_cuda {
namespace {

template <class KT, class VT>
__global__ void rope_kv_write_kernel(float* q, float* k, const float* v, int H, RopeArgs rp,
                                     KvLayer kv, int pos0, const int* pos0_dev, KT* kc, VT* vc) {
  const int t = blockIdx.x;
  const int Hkv = kv.n_head_kv, D = kv.head_dim;
  const int pos = (pos0_dev != nullptr ? *pos0_dev : pos0) + t;
  const int slot = kv_slot(kv, pos);
  const int half = rp.n_rot / 2;
  const int pairs = (D + 1) / 2;  // pairs per kv head row, the last one short for odd D
  const int n_q = H * half;
  const int total = n_q + Hkv * pairs;
  float* qr = q + int64_t(t) * H * D;
  float* kr = k + int64_t(t) * Hkv * D;
  const float* vr = v + int64_t(t) * Hkv * D;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    float c, s;
    int a, b;
    if (e < n_q) {
      const int h = e / half, i = e % half;
      rope_cos_sin(pos, i, rp, &c, &s);
      rope_pair(rp, i, &a, &b);
      rope_rotate(qr + h * D + a, qr + h * D + b, c, s);
      continue;
    }
    const int r = e - n_q;
    const int h = r / pairs, i = r % pairs;
    float* kh = kr + h * D;
    rope_pair(rp, i, &a, &b);
    if (i < half) {
      rope_cos_sin(pos, i, rp, &c, &s);
      rope_rotate(kh + a, kh + b, c, s);
    }
    const int64_t dst = (int64_t(h) * kv.n_slots + slot) * D;
    kc[dst + a] = to_cache<KT>(kh[a]);
    vc[dst + a] = to_cache<VT>(vr[h * D + a]);
    if (b < D) {
      kc[dst + b] = to_cache<KT>(kh[b]);
      vc[dst + b] = to_cache<VT>(vr[h * D + b]);
    }
    if (r == 0) kv.pos[slot] = pos;
  }
}

}  // namespace

cudaError_t rope_kv_write(float* q, float* k, const float* v, int T, int n_head, RopeArgs r,
                          KvLayer kv, int pos0, const int* pos0_dev, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > kv.head_dim || n_head <= 0 ||
      kv.n_head_kv <= 0 || kv.pos == nullptr || kv.n_slots <= kv.sink)
    return cudaErrorInvalidValue;
  const int work = n_head * (r.n_rot / 2) + kv.n_head_kv * ((kv.head_dim + 1) / 2);
  const int threads = work >= 512 ? 512 : (work + 31) / 32 * 32;  // one pair per thread at decode
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KT = typename decltype(kt)::type;
    using VT = typename decltype(vt)::type;
    return launch(rope_kv_write_kernel<KT, VT>, dim3(T), dim3(threads), 0, s, q, k, v, n_head, r,
                  kv, pos0, pos0_dev, static_cast<KT*>(kv.k), static_cast<VT*>(kv.v));
  });
}

}  // namespace kvscope_cuda
