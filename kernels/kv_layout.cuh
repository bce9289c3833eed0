// kv_layout.cuh — where a position lives in a layer's KV cache, which keys a query sees,
// and the K/V element-type dispatch, shared by every kernel that touches the cache
// (kv_write, rope_kv_write, kv_row_norms, kv_rerotate, attention). The rules are the engine's KvCache
// rules (engine/kv_cache.h); kernels/kernels.h describes KvLayer.
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"
#include "kernels/kv_quant.cuh"

namespace kvscope::cuda {

// Slot of position p: p itself below the sinks, then a ring over the other slots; in a
// paged cache (no rings) always p.
__device__ __forceinline__ int kv_slot(const KvLayer& kv, int p) {
  if (kv.blocks) return p;
  return p < kv.sink ? p : kv.sink + (p - kv.sink) % (kv.n_slots - kv.sink);
}

// Row index of slot `slot` of kv head h in the layer's K or V store (times the row
// bytes: the row's offset): through the block table of a paged cache.
// A hole in the table (a block a windowed layer gave back: its slots hold no position)
// reads row 0 of the block's place instead; kernels never use what they read there.
__device__ __forceinline__ int64_t kv_row(const KvLayer& kv, int h, int slot) {
  int phys = slot;
  if (kv.blocks) {  // shifts, not divisions: this runs for every row a kernel reads
    const int b = kv.blocks[slot >> kv.block_shift];
    phys = ((b < 0 ? 0 : b) << kv.block_shift) | (slot & (kv.block - 1));
  }
  return int64_t(h) * (kv.stride > 0 ? kv.stride : kv.n_slots) + phys;
}

// Whether a query at position q sees the key at position k (k < 0: empty slot).
__device__ __forceinline__ bool kv_visible(const KvLayer& kv, int k, int q) {
  return k >= 0 && k <= q && (kv.window == 0 || q - k < kv.window || k < kv.sink);
}

template <class T>
struct KvTag {
  using type = T;
};

__host__ __device__ inline bool kv_is_block(KvElem e) {
  return e == KvElem::Q8_0 || e == KvElem::Q4_0;
}

// Calls f(KvTag<element traits>{}) for one side's type (kv_quant.cuh: KvF32, KvF16,
// KvQ8_0, KvQ4_0); an unknown type is cudaErrorInvalidValue.
template <class F>
cudaError_t kv_dispatch_one(KvElem t, F&& f) {
  switch (t) {
    case KvElem::F32:
      return f(KvTag<KvF32>{});
    case KvElem::F16:
      return f(KvTag<KvF16>{});
    case KvElem::Q8_0:
      return f(KvTag<KvQ8_0>{});
    case KvElem::Q4_0:
      return f(KvTag<KvQ4_0>{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(KvTag<K traits>{}, KvTag<V traits>{}) for the layer's types, chosen apart (16
// combinations); an unknown type, or a block type with a head dim that is not a multiple
// of 32, is cudaErrorInvalidValue.
template <class F>
cudaError_t kv_dispatch(const KvLayer& kv, F&& f) {
  if ((kv_is_block(kv.k_type) || kv_is_block(kv.v_type)) && kv.head_dim % 32 != 0)
    return cudaErrorInvalidValue;
  return kv_dispatch_one(kv.k_type, [&](auto kt) {
    return kv_dispatch_one(kv.v_type, [&](auto vt) { return f(kt, vt); });
  });
}

// The same for the K side alone (kernels that touch only K rows).
template <class F>
cudaError_t kv_dispatch_k(const KvLayer& kv, F&& f) {
  if (kv_is_block(kv.k_type) && kv.head_dim % 32 != 0) return cudaErrorInvalidValue;
  return kv_dispatch_one(kv.k_type, f);
}

}  // namespace kvscope::cuda
