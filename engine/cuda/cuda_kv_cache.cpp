// cuda_kv_cache.cpp — see cuda_kv_cache.h.
#include "engine/cuda/cuda_kv_cache.h"

#include <algorithm>

namespace kvscope {

CudaKvCache::CudaKvCache(const KvCacheConfig& config, cudaStream_t stream,
                         std::shared_ptr<KvPool> pool)
    : KvCache(config, pool),
      stream_(stream),
      cuda_pool_(static_cast<const CudaKvPool*>(pool.get())),
      k_(size_t(config.shape.n_layer)),
      v_(size_t(config.shape.n_layer)),
      pos_(size_t(config.shape.n_layer)),
      slots_(size_t(config.shape.n_layer), 0) {}

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
  blocks_dev_.resize(size_t(n_groups()));
  for (int g = 0; g < n_groups(); ++g) {
    const auto& t = blocks(g);
    if (t.empty()) continue;
    // Grown by half again, so a sequence's new blocks rarely reallocate it.
    DeviceBuffer& dev = blocks_dev_[size_t(g)];
    const size_t need = t.size() * sizeof(int32_t);
    if (need > dev.bytes)
      KV_TRY(dev.ensure(std::max(need, dev.bytes + dev.bytes / 2), "the KV block table"));
    KV_TRY(cuda_check(cudaMemcpyAsync(dev.p, t.data(), need, cudaMemcpyHostToDevice, stream_),
                      "uploading the KV block table"));
  }
  for (int l = 0; l < shape().n_layer; ++l) {
    const auto& map = slot_pos(l);
    slots_[size_t(l)] = int(map.size());
    if (map.empty()) continue;
    const size_t need = map.size() * sizeof(int32_t);
    DeviceBuffer& dev = pos_[size_t(l)];
    if (need > dev.bytes)
      KV_TRY(dev.ensure(std::max(need, dev.bytes + dev.bytes / 2), "the KV cache slot map"));
    KV_TRY(cuda_check(cudaMemcpyAsync(pos_[size_t(l)].p, map.data(), map.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_),
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
  }
  return kl;
}

Status CudaKvCache::relayout(int layer, int n_slots, const std::vector<int32_t>& from) {
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
