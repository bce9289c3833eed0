// kv_append.cu — store this step's K and V rows into the layer's cache (each side f16 or
// f32) at their positions' slots, and record the positions in the slot map.
// Thread mapping: grid-stride loop, one thread per stored value (t, kv head, d); the
// thread of (t, 0, 0) writes the map entry.
// Shapes: k, v [T][Hkv*D] fp32 -> cache K, V [Hkv][n_slots][D] at kv_slot(pos0 + t).
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope_cuda {
namespace {

template <class KT, class VT>
__global__ void kv_append_kernel(const float* k, const float* v, int T, KvLayer kv, int pos0,
                                 KT* kc, VT* vc) {
  const int Hkv = kv.n_head_kv, D = kv.head_dim;
  const int64_t total = int64_t(T) * Hkv * D;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t t = e / (int64_t(Hkv) * D);
    const int r = static_cast<int>(e % (int64_t(Hkv) * D));
    const int h = r / D, d = r % D;
    const int pos = pos0 + static_cast<int>(t);
    const int slot = kv_slot(kv, pos);
    const int64_t dst = (int64_t(h) * kv.n_slots + slot) * D + d;
    kc[dst] = to_cache<KT>(k[e]);
    vc[dst] = to_cache<VT>(v[e]);
    if (r == 0) kv.pos[slot] = pos;
  }
}

}  // namespace

cudaError_t kv_append(KvLayer kv, const float* k, const float* v, int T, int pos0,
                      cudaStream_t s) {
  const int64_t total = int64_t(T) * kv.n_head_kv * kv.head_dim;
  if (total <= 0) return cudaSuccess;
  if (kv.pos == nullptr || kv.n_slots <= kv.sink) return cudaErrorInvalidValue;
  const int64_t blocks = (total + 255) / 256;
  const dim3 grid(unsigned(blocks < 4096 ? blocks : 4096));
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KT = typename decltype(kt)::type;
    using VT = typename decltype(vt)::type;
    return launch(kv_append_kernel<KT, VT>, grid, dim3(256), 0, s, k, v, T, kv, pos0,
                  static_cast<KT*>(kv.k), static_cast<VT*>(kv.v));
  });
}

}  // namespace kvscope_cuda
