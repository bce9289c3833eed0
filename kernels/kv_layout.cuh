// kv_layout.cuh — where a position lives in a layer's KV cache, which keys a query sees,
// and the K/V element-type dispatch, shared by every kernel that touches the cache
// (kv_append, rope_kv_write, kv_norms, attention). The rules are the engine's KvCache
// rules (engine/kv_cache.h); kernels/kernels.h describes KvLayer.
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

namespace kvscope_cuda {

// Slot of position p: p itself below the sinks, then a ring over the other slots.
__device__ __forceinline__ int kv_slot(const KvLayer& kv, int p) {
  return p < kv.sink ? p : kv.sink + (p - kv.sink) % (kv.n_slots - kv.sink);
}

// Whether a query at position q sees the key at position k (k < 0: empty slot).
__device__ __forceinline__ bool kv_visible(const KvLayer& kv, int k, int q) {
  return k >= 0 && k <= q && (kv.window == 0 || q - k < kv.window || k < kv.sink);
}

template <class T>
struct KvTag {
  using type = T;
};

// Calls f(KvTag<K element>{}, KvTag<V element>{}) for the layer's types; an unsupported
// combination is cudaErrorInvalidValue.
template <class F>
cudaError_t kv_dispatch(const KvLayer& kv, F&& f) {
  const bool k16 = kv.k_type == KvElem::F16, v16 = kv.v_type == KvElem::F16;
  const bool k32 = kv.k_type == KvElem::F32, v32 = kv.v_type == KvElem::F32;
  if (k16 && v16) return f(KvTag<__half>{}, KvTag<__half>{});
  if (k16 && v32) return f(KvTag<__half>{}, KvTag<float>{});
  if (k32 && v16) return f(KvTag<float>{}, KvTag<__half>{});
  if (k32 && v32) return f(KvTag<float>{}, KvTag<float>{});
  return cudaErrorInvalidValue;
}

}  // namespace kvscope_cuda
