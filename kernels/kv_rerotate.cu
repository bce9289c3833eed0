// kv_rerotate.cu — the context shift's re-rotation: in one layer of the KV cache, every
// K row whose slot holds a position >= first rotates in place by `delta` positions (the
// pair rotation of rope() at pos = delta), stored back in the K element type (fp16 rounded
// to nearest). RoPE is a rotation, so a row rotated at p and then by -n equals the row
// rotated at p - n up to rounding.
// Thread mapping: one block per slot; threads stride over (kv head, pair). Empty slots
// (pos -1) and positions below first are left alone.
// Shapes: cache K [Hkv][n_slots][D]; pos [n_slots].
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope_cuda {
namespace {

template <class KT>
__global__ void kv_rerotate_kernel(KT* kc, KvLayer kv, RopeArgs r, int first, int delta) {
  const int slot = static_cast<int>(blockIdx.x);
  if (kv.pos[slot] < first || kv.pos[slot] < 0) return;
  const int D = kv.head_dim, half = r.n_rot / 2;
  for (int e = threadIdx.x; e < kv.n_head_kv * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    float c, s;
    int a, b;
    rope_cos_sin(delta, i, r, &c, &s);
    rope_pair(r, i, &a, &b);
    KT* row = kc + (int64_t(h) * kv.n_slots + slot) * D;
    float x0 = static_cast<float>(row[a]), x1 = static_cast<float>(row[b]);
    rope_rotate(&x0, &x1, c, s);
    row[a] = to_cache<KT>(x0);
    row[b] = to_cache<KT>(x1);
  }
}

}  // namespace

cudaError_t kv_rerotate(KvLayer kv, RopeArgs r, int first, int delta, cudaStream_t s) {
  if (kv.n_slots <= 0) return cudaSuccess;
  if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > kv.head_dim || first < 0)
    return cudaErrorInvalidValue;
  const int work = kv.n_head_kv * (r.n_rot / 2);
  if (work == 0) return cudaSuccess;
  const int threads = work >= 128 ? 128 : (work + 31) / 32 * 32;
  return kv_dispatch(kv, [&](auto kt, auto) {
    using KT = typename decltype(kt)::type;
    return launch(kv_rerotate_kernel<KT>, dim3(kv.n_slots), dim3(threads), 0, s,
                  static_cast<KT*>(kv.k), kv, r, first, delta);
  });
}

}  // namespace kvscope_cuda
