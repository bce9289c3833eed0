// cuda_kv_cache.cpp — see cuda_kv_cache.h.
#include "engine/cuda/cuda_kv_cache.h"

namespace kvscope {

CudaKvCache::CudaKvCache(const KvCacheConfig& config, cudaStream_t stream)
    : KvCache(config),
      stream_(stream),
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
