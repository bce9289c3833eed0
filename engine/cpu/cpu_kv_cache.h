// cpu_kv_cache.h — the CPU backend's KV cache storage: per layer K and V, each
// [Hkv][n_slots][D] in its K / V type (f16 or f32), slots mapped to positions by the
// engine's KvCache (engine/kv_cache.h); and the conversion of cached rows to and from fp32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/kv_cache.h"

namespace kvscope::cpu {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

inline Buffer alloc_bytes(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(64, rounded))));
}

// Per layer K and V, each [Hkv][n_slots][row bytes of D values] in the K / V type.
class CpuKvCache final : public KvCache {
 public:
  explicit CpuKvCache(const KvCacheConfig& config)
      : KvCache(config),
        k_(size_t(config.shape.n_layer)),
        v_(size_t(config.shape.n_layer)),
        slots_(size_t(config.shape.n_layer), 0) {}

  static Expected<std::unique_ptr<KvCache>> create(const KvCacheConfig& config, int capacity) {
    auto cache = std::make_unique<CpuKvCache>(config);
    KV_TRY(cache->init_storage(capacity));
    return std::unique_ptr<KvCache>(std::move(cache));
  }

  // Row of kv head h in slot s of layer l.
  uint8_t* k_row(int l, int h, int s) const { return row(k_, types().k, l, h, s); }
  uint8_t* v_row(int l, int h, int s) const { return row(v_, types().v, l, h, s); }

 protected:
  Status relayout(int layer, int n_slots, const std::vector<int32_t>& from) override {
    const KvShape& sh = shape();
    const auto moves = kv_moves(from);
    for (auto [side, type] : {std::pair{&k_, types().k}, std::pair{&v_, types().v}}) {
      const size_t rb = kv_row_bytes(type, sh.head_dim);
      Buffer fresh = alloc_bytes(size_t(sh.n_head_kv) * size_t(n_slots) * rb);
      if (!fresh)
        return make_error("cpu: out of memory laying out the KV cache in ", n_slots, " slots");
      const Buffer& old = (*side)[size_t(layer)];
      const size_t old_slots = slots_[size_t(layer)];
      for (int h = 0; h < sh.n_head_kv; ++h)
        for (const KvMove& m : moves)
          std::memcpy(fresh.get() + (size_t(h) * n_slots + size_t(m.dst)) * rb,
                      old.get() + (size_t(h) * old_slots + size_t(m.src)) * rb, size_t(m.n) * rb);
      (*side)[size_t(layer)] = std::move(fresh);
    }
    slots_[size_t(layer)] = size_t(n_slots);
    return Status::Ok();
  }

 private:
  uint8_t* row(const std::vector<Buffer>& side, KvDtype type, int l, int h, int s) const {
    const size_t rb = kv_row_bytes(type, shape().head_dim);
    return side[size_t(l)].get() + (size_t(h) * slots_[size_t(l)] + size_t(s)) * rb;
  }

  std::vector<Buffer> k_, v_;
  std::vector<size_t> slots_;  // slots allocated per layer
};

// Loads D values of a cache row as fp32.
void load_row(KvDtype dtype, const uint8_t* src, float* dst, int D);
// Stores D fp32 values as a cache row (f16: rounded to nearest even).
void store_row(KvDtype dtype, const float* src, uint8_t* dst, int D);

}  // namespace kvscope::cpu
