// cuda_kv_cache.cpp — see cuda_kv_cache.h.
#include "engine/cuda/cuda_kv_cache.h"

#include <algorithm>
#include <atomic>

namespace kvscope {
namespace {

// Layout versions are unique across caches: a cache made where a freed one lived never
// repeats that one's (address, version) pair.
uint64_t next_layout_version() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

}  // namespace

CudaKvCache::CudaKvCache(const KvCacheConfig& config, cudaStream_t stream,
                         std::shared_ptr<KvPool> pool)
    : KvCache(config, pool),
      stream_(stream),
      cuda_pool_(static_cast<const CudaKvPool*>(pool.get())),
      k_(size_t(config.shape.n_layer)),
      v_(size_t(config.shape.n_layer)),
      pos_(size_t(config.shape.n_layer)),
      slots_(size_t(config.shape.n_layer), 0),
      version_(next_layout_version()) {}

Expected<std::unique_ptr<KvCache>> CudaKvCache::create(const KvCacheConfig& config, int capacity,
                                                       cudaStream_t stream) {
  for (KvDtype t : {config.types.k, config.types.v})
    if (t != KvDtype::F16 && t != KvDtype::F32 && t != KvDtype::Q8_0 && t != KvDtype::Q4_0)
      return make_error("cuda: KV cache type ", kv_dtype_name(t), " is not supported (",
                        kv_dtype_choices(), ")");
  auto cache = std::make_unique<CudaKvCache>(config, stream);
  KV_TRY(cache->init_storage(capacity));
  return std::unique_ptr<KvCache>(std::move(cache));
}

Expected<std::unique_ptr<KvCache>> CudaKvCache::create_paged(const KvCacheConfig& config,
                                                             std::shared_ptr<KvPool> pool,
                                                             cudaStream_t stream) {
  auto cache = std::make_unique<CudaKvCache>(config, stream, std::move(pool));
  KV_TRY(cache->init_storage(0));
  return std::unique_ptr<KvCache>(std::move(cache));
}

Expected<std::shared_ptr<KvPool>> CudaKvPool::create(const KvPoolConfig& config,
                                                     cudaStream_t stream) {
  KV_TRY(kv_pool_config_check(config));
  auto pool = std::shared_ptr<CudaKvPool>(new CudaKvPool(config, stream));
  const KvShape& sh = config.shape;
  for (int l = 0; l < sh.n_layer; ++l)
    for (auto [side, type] : {std::pair{&pool->k_, config.types.k}, std::pair{&pool->v_, config.types.v}}) {
      side->emplace_back();
      KV_TRY(side->back().ensure(size_t(sh.n_head_kv) * size_t(pool->rows()) *
                                     kv_row_bytes(type, sh.head_dim),
                                 "the KV block pool"));
    }
  return std::shared_ptr<KvPool>(std::move(pool));
}

Status CudaKvPool::do_move_rows(const std::vector<RowMove>& moves) {
  // One copy per move, layer, side and kv head. Copies on one stream run in order, as
  // move_rows() promises. (A context shift is rare: a few thousand small copies.)
  const KvShape& sh = config().shape;
  for (const RowMove& m : moves)
    for (int l = 0; l < sh.n_layer; ++l)
      for (auto [side, type] : {std::pair{&k_, config().types.k}, std::pair{&v_, config().types.v}}) {
        const size_t rb = kv_row_bytes(type, sh.head_dim);
        auto* base = static_cast<uint8_t*>((*side)[size_t(l)].p);
        for (int h = 0; h < sh.n_head_kv; ++h) {
          const size_t head = size_t(h) * size_t(rows());
          KV_TRY(cuda_check(cudaMemcpyAsync(base + (head + size_t(m.dst)) * rb,
                                            base + (head + size_t(m.src)) * rb, size_t(m.n) * rb,
                                            cudaMemcpyDeviceToDevice, stream_),
                            "moving KV rows"));
        }
      }
  return Status::Ok();
}

Status CudaKvPool::do_copy_block(int dst, int src) {
  const KvShape& sh = config().shape;
  const size_t B = size_t(block_size());
  for (int l = 0; l < sh.n_layer; ++l)
    for (auto [side, type] : {std::pair{&k_, config().types.k}, std::pair{&v_, config().types.v}}) {
      const size_t rb = kv_row_bytes(type, sh.head_dim);
      auto* base = static_cast<uint8_t*>((*side)[size_t(l)].p);
      for (int h = 0; h < sh.n_head_kv; ++h)
        KV_TRY(cuda_check(
            cudaMemcpyAsync(base + (size_t(h) * size_t(rows()) + size_t(dst) * B) * rb,
                            base + (size_t(h) * size_t(rows()) + size_t(src) * B) * rb, B * rb,
                            cudaMemcpyDeviceToDevice, stream_),
            "copying a KV block"));
    }
  return Status::Ok();
}

Status CudaKvCache::paged_changed() {
  // The device copies have room for more slots than the cache holds (grown by half again,
  // padded with empty slots and holes), so a sequence's new blocks rarely reallocate them:
  // the kernels' arguments (pointers, slot count) then stay the same from step to step,
  // and a decode step keeps replaying one CUDA graph.
  version_ = next_layout_version();
  const int B = pool()->block_size();
  blocks_dev_.resize(size_t(n_groups()));
  group_slots_.resize(size_t(n_groups()), 0);
  for (int g = 0; g < n_groups(); ++g) {
    const auto& t = blocks(g);
    int& cap = group_slots_[size_t(g)];
    const int need = int(t.size()) * B;
    if (need > cap) cap = std::max(need, (cap + cap / 2 + B - 1) / B * B);
    if (cap == 0) continue;
    DeviceBuffer& dev = blocks_dev_[size_t(g)];
    const size_t bytes = size_t(cap / B) * sizeof(int32_t);
    if (bytes > dev.bytes) KV_TRY(dev.ensure(bytes, "the KV block table"));
    staging_.assign(t.begin(), t.end());
    staging_.resize(size_t(cap / B), -1);
    KV_TRY(cuda_check(cudaMemcpyAsync(dev.p, staging_.data(), bytes, cudaMemcpyHostToDevice, stream_),
                      "uploading the KV block table"));
  }
  for (int l = 0; l < shape().n_layer; ++l) {
    const int cap = group_slots_[size_t(group_of(l))];
    slots_[size_t(l)] = cap;
    if (cap == 0) continue;
    const auto& map = slot_pos(l);
    const size_t bytes = size_t(cap) * sizeof(int32_t);
    DeviceBuffer& dev = pos_[size_t(l)];
    if (bytes > dev.bytes) KV_TRY(dev.ensure(bytes, "the KV cache slot map"));
    staging_.assign(map.begin(), map.end());
    staging_.resize(size_t(cap), -1);
    // Pageable source: the call returns once the bytes are staged.
    KV_TRY(cuda_check(cudaMemcpyAsync(dev.p, staging_.data(), bytes, cudaMemcpyHostToDevice, stream_),
                      "uploading the KV cache slot map"));
  }
  return Status::Ok();
}

kvscope::cuda::KvLayer CudaKvCache::layer(int l) const {
  const KvShape& s = shape();
  kvscope::cuda::KvLayer kl;
  kl.k = k_[size_t(l)].p;
  kl.v = v_[size_t(l)].p;
  kl.k_type = kvscope::cuda::KvElem(int(types().k));
  kl.v_type = kvscope::cuda::KvElem(int(types().v));
  kl.n_head_kv = s.n_head_kv;
  kl.head_dim = s.head_dim;
  kl.n_slots = slots_[size_t(l)];
  kl.sink = rule(l).sink;
  kl.window = rule(l).window;
  kl.pos = static_cast<int32_t*>(pos_[size_t(l)].p);
  kl.stride = kl.n_slots;
  if (cuda_pool_) {
    kl.k = cuda_pool_->k(layer_in_group(l));
    kl.v = cuda_pool_->v(layer_in_group(l));
    kl.stride = cuda_pool_->rows();
    kl.blocks = size_t(group_of(l)) < blocks_dev_.size()
                    ? static_cast<const int32_t*>(blocks_dev_[size_t(group_of(l))].p)
                    : nullptr;
    kl.block = cuda_pool_->block_size();
    while ((1 << kl.block_shift) < kl.block) ++kl.block_shift;
  }
  return kl;
}

Status CudaKvCache::relayout(int layer, int n_slots, const std::vector<int32_t>& from) {
  version_ = next_layout_version();
  const KvShape& s = shape();
  const auto moves = kv_moves(from);
  const size_t old_slots = size_t(slots_[size_t(layer)]);
  for (auto [side, type] : {std::pair{&k_, types().k}, std::pair{&v_, types().v}}) {
    const size_t rb = kv_row_bytes(type, s.head_dim);
    DeviceBuffer fresh;
    KV_TRY(fresh.ensure(size_t(s.n_head_kv) * size_t(n_slots) * rb, "the KV cache"));
    const DeviceBuffer& old = (*side)[size_t(layer)];
    for (int h = 0; h < s.n_head_kv; ++h)
      for (const KvMove& m : moves)
        KV_TRY(cuda_check(
            cudaMemcpyAsync(
                static_cast<uint8_t*>(fresh.p) + (size_t(h) * n_slots + size_t(m.dst)) * rb,
                static_cast<const uint8_t*>(old.p) + (size_t(h) * old_slots + size_t(m.src)) * rb,
                size_t(m.n) * rb, cudaMemcpyDeviceToDevice, stream_),
            "moving KV cache rows"));
    // The old buffer is freed only after the copies: cudaFree waits for them.
    (*side)[size_t(layer)] = std::move(fresh);
  }
  DeviceBuffer map;
  KV_TRY(map.ensure(size_t(n_slots) * sizeof(int32_t), "the KV cache slot map"));
  // Pageable source: the call returns once the bytes are staged.
  KV_TRY(
      cuda_check(cudaMemcpyAsync(map.p, slot_pos(layer).data(), size_t(n_slots) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_),
                 "uploading the KV cache slot map"));
  pos_[size_t(layer)] = std::move(map);
  slots_[size_t(layer)] = n_slots;
  return Status::Ok();
}

}  // namespace kvscope
