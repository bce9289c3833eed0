// cpu_kv_cache.h — the CPU backend's KV cache storage: per layer K and V, each
// [Hkv][n_slots][D] in its K / V type, slots mapped to positions by the engine's KvCache
// (engine/kv_cache.h); the shared block pool (CpuKvPool: per layer K and V, each
// [Hkv][n_blocks * B][D]) whose rows a paged cache addresses through its block table;
// and the conversion of cached rows to and from fp32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_pool.h"

namespace kvscope::cpu {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

inline Buffer alloc_bytes(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(64, rounded))));
}

// The pool's storage: per layer of a group (config.shape.n_layer of them) K and V, each
// [Hkv][n_blocks * B][row bytes]; layer l of a cache uses those of its index in its group.
class CpuKvPool final : public KvPool {
 public:
  static Expected<std::shared_ptr<KvPool>> create(const KvPoolConfig& config) {
    KV_TRY(kv_pool_config_check(config));
    auto pool = std::shared_ptr<CpuKvPool>(new CpuKvPool(config));
    const KvShape& sh = config.shape;
    const size_t slots = size_t(config.n_blocks) * size_t(config.block_size);
    for (int l = 0; l < sh.n_layer; ++l)
      for (auto [side, type] : {std::pair{&pool->k_, config.types.k}, std::pair{&pool->v_, config.types.v}}) {
        side->push_back(alloc_bytes(size_t(sh.n_head_kv) * slots * kv_row_bytes(type, sh.head_dim)));
        if (!side->back())
          return make_error("cpu: out of memory for a KV pool of ", config.n_blocks, " blocks (",
                            (kv_block_bytes(config) * uint64_t(config.n_blocks)) >> 20, " MiB)");
      }
    return std::shared_ptr<KvPool>(std::move(pool));
  }
  uint8_t* k_row(int l, int h, int phys) const { return row(k_, config().types.k, l, h, phys); }
  uint8_t* v_row(int l, int h, int phys) const { return row(v_, config().types.v, l, h, phys); }

 protected:
  Status do_copy_block(int dst, int src) override {
    const KvShape& sh = config().shape;
    const int B = block_size();
    for (int l = 0; l < sh.n_layer; ++l)
      for (int h = 0; h < sh.n_head_kv; ++h) {
        std::memcpy(k_row(l, h, dst * B), k_row(l, h, src * B),
                    size_t(B) * kv_row_bytes(config().types.k, sh.head_dim));
        std::memcpy(v_row(l, h, dst * B), v_row(l, h, src * B),
                    size_t(B) * kv_row_bytes(config().types.v, sh.head_dim));
      }
    return Status::Ok();
  }
  Status do_move_rows(const std::vector<RowMove>& moves) override {
    const KvShape& sh = config().shape;
    for (const RowMove& m : moves)
      for (int l = 0; l < sh.n_layer; ++l)
        for (int h = 0; h < sh.n_head_kv; ++h) {
          std::memcpy(k_row(l, h, m.dst), k_row(l, h, m.src),
                      size_t(m.n) * kv_row_bytes(config().types.k, sh.head_dim));
          std::memcpy(v_row(l, h, m.dst), v_row(l, h, m.src),
                      size_t(m.n) * kv_row_bytes(config().types.v, sh.head_dim));
        }
    return Status::Ok();
  }

 private:
  explicit CpuKvPool(const KvPoolConfig& c) : KvPool(c) {}
  uint8_t* row(const std::vector<Buffer>& side, KvDtype type, int l, int h, int phys) const {
    const size_t rb = kv_row_bytes(type, config().shape.head_dim);
    const size_t slots = size_t(n_blocks()) * size_t(block_size());
    return side[size_t(l)].get() + (size_t(h) * slots + size_t(phys)) * rb;
  }
  std::vector<Buffer> k_, v_;
};

// Per layer K and V, each [Hkv][n_slots][row bytes of D values] in the K / V type; or,
// paged, rows in a CpuKvPool at the physical slots of the cache's block table.
class CpuKvCache final : public KvCache {
 public:
  explicit CpuKvCache(const KvCacheConfig& config, std::shared_ptr<KvPool> pool = nullptr)
      : KvCache(config, pool),
        k_(size_t(config.shape.n_layer)),
        v_(size_t(config.shape.n_layer)),
        slots_(size_t(config.shape.n_layer), 0),
        cpu_pool_(static_cast<const CpuKvPool*>(pool.get())) {}

  static Expected<std::unique_ptr<KvCache>> create(const KvCacheConfig& config, int capacity) {
    auto cache = std::make_unique<CpuKvCache>(config);
    KV_TRY(cache->init_storage(capacity));
    return std::unique_ptr<KvCache>(std::move(cache));
  }
  // A paged cache over `pool` (a CpuKvPool).
  static Expected<std::unique_ptr<KvCache>> create_paged(const KvCacheConfig& config,
                                                         std::shared_ptr<KvPool> pool) {
    auto cache = std::make_unique<CpuKvCache>(config, std::move(pool));
    KV_TRY(cache->init_storage(0));
    return std::unique_ptr<KvCache>(std::move(cache));
  }

  // Row of kv head h in slot s of layer l.
  uint8_t* k_row(int l, int h, int s) const {
    return cpu_pool_ ? cpu_pool_->k_row(layer_in_group(l), h, physical_slot(l, s))
                     : row(k_, types().k, l, h, s);
  }
  uint8_t* v_row(int l, int h, int s) const {
    return cpu_pool_ ? cpu_pool_->v_row(layer_in_group(l), h, physical_slot(l, s))
                     : row(v_, types().v, l, h, s);
  }
  // The row of physical slot 0 for kv head h of layer l: row s is at
  // base + physical_slot(l, s) * row bytes (what the attention kernels index).
  const uint8_t* k_base(int l, int h) const {
    return cpu_pool_ ? cpu_pool_->k_row(layer_in_group(l), h, 0) : row(k_, types().k, l, h, 0);
  }
  const uint8_t* v_base(int l, int h) const {
    return cpu_pool_ ? cpu_pool_->v_row(layer_in_group(l), h, 0) : row(v_, types().v, l, h, 0);
  }

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
  const CpuKvPool* cpu_pool_ = nullptr;  // paged only
};

// Loads D values of a cache row as fp32.
void load_row(KvDtype dtype, const uint8_t* src, float* dst, int D);
// Stores D fp32 values as a cache row (f16: rounded to nearest even).
void store_row(KvDtype dtype, const float* src, uint8_t* dst, int D);

}  // namespace kvscope::cpu
