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
  // Block copies (copy-on-write) run as one launch over every layer's K and V.
  std::vector<void*> bases;
  for (int l = 0; l < sh.n_layer; ++l) {
    bases.push_back(pool->k_[size_t(l)].p);
    bases.push_back(pool->v_[size_t(l)].p);
  }
  KV_TRY(pool->bases_.ensure(bases.size() * sizeof(void*), "the KV block pool"));
  KV_TRY(cuda_check(cudaMemcpy(pool->bases_.p, bases.data(), bases.size() * sizeof(void*),
                               cudaMemcpyHostToDevice),
                    "uploading the KV block pool's addresses"));
  kvscope::cuda::KvPoolCopy& cp = pool->copy_;
  cp.bases = static_cast<void* const*>(pool->bases_.p);
  cp.n_bases = int(bases.size());
  cp.n_head_kv = sh.n_head_kv;
  cp.block = pool->block_size();
  cp.rows = pool->rows();
  cp.row_bytes[0] = int64_t(kv_row_bytes(config.types.k, sh.head_dim));
  cp.row_bytes[1] = int64_t(kv_row_bytes(config.types.v, sh.head_dim));
  return std::shared_ptr<KvPool>(std::move(pool));
}

Status CudaKvPool::do_move_rows(const std::vector<RowMove>& moves) {
  // One upload and one launch, whatever the number of moves, layers and heads: the kernel
  // runs the moves in order within each layer's K or V and kv head, as move_rows() promises
  // (a copy per move, layer, side and head was thousands of calls for a long shift).
  staged_moves_.clear();
  for (const RowMove& m : moves) staged_moves_.push_back({m.dst, m.src, m.n});
  const size_t bytes = staged_moves_.size() * sizeof(kvscope::cuda::KvRowMove);
  if (bytes > moves_.bytes) KV_TRY(moves_.ensure(bytes, "the KV row moves"));
  // Pageable source: the call returns once the bytes are staged.
  KV_TRY(cuda_check(
      cudaMemcpyAsync(moves_.p, staged_moves_.data(), bytes, cudaMemcpyHostToDevice, stream_),
      "uploading the KV row moves"));
  return cuda_check(
      kvscope::cuda::kv_move_rows(copy_, static_cast<const kvscope::cuda::KvRowMove*>(moves_.p),
                                  int(staged_moves_.size()), stream_),
      "moving KV rows");
}

Status CudaKvPool::do_copy_block(int dst, int src) {
  return cuda_check(kvscope::cuda::kv_copy_block(copy_, dst, src, stream_), "copying a KV block");
}

Status CudaKvCache::paged_changed(PagedChange change) {
  // The device copy has room for more slots than the cache holds (grown by half again,
  // padded with empty slots and holes), so a sequence's new blocks rarely reallocate it:
  // the kernels' arguments (pointers, slot count) then stay the same from step to step,
  // and a decode step keeps replaying one CUDA graph. Each refresh is one copy from the
  // host, whatever the number of layers: with many sequences in a batch, a copy (and an
  // allocation) per layer per new block was host time the GPU waited through.
  version_ = next_layout_version();
  const int B = pool()->block_size(), G = n_groups(), L = shape().n_layer;
  group_slots_.resize(size_t(G), 0);
  bool covered = paged_dev_.p != nullptr;  // every table fits the slots already laid out
  for (int g = 0; g < G; ++g) {
    int& cap = group_slots_[size_t(g)];
    const int need = int(blocks(g).size()) * B;
    if (need > cap) {
      cap = std::max(need, (cap + cap / 2 + B - 1) / B * B);
      covered = false;
    }
  }
  // Growth inside the slots laid out: the maps on the device already hold what the host's
  // do, but for the positions this forward's K/V writes set. The tables alone go up.
  const bool tables_only = covered && change == PagedChange::Grown;
  if (!covered) {
    table_at_.assign(size_t(G), 0);
    map_at_.assign(size_t(L), 0);
    size_t at = 0;
    for (int g = 0; g < G; ++g) {
      table_at_[size_t(g)] = at;
      at += size_t(group_slots_[size_t(g)] / B);
    }
    tables_len_ = at;
    for (int l = 0; l < L; ++l) {
      map_at_[size_t(l)] = at;
      at += size_t(group_slots_[size_t(group_of(l))]);
    }
    paged_len_ = at;
    if (at == 0) return Status::Ok();  // nothing held, nothing laid out yet
    // The old copy goes: cudaFree waits for the kernels that may still read it.
    KV_TRY(paged_dev_.ensure(at * sizeof(int32_t), "the KV block tables and slot maps"));
  }
  const size_t len = tables_only ? tables_len_ : paged_len_;
  staging_.assign(len, -1);
  for (int g = 0; g < G; ++g)
    std::copy(blocks(g).begin(), blocks(g).end(),
              staging_.begin() + ptrdiff_t(table_at_[size_t(g)]));
  if (!tables_only)
    for (int l = 0; l < L; ++l)
      std::copy(slot_pos(l).begin(), slot_pos(l).end(),
                staging_.begin() + ptrdiff_t(map_at_[size_t(l)]));
  for (int l = 0; l < L; ++l) slots_[size_t(l)] = group_slots_[size_t(group_of(l))];
  // Pageable source: the call returns once the bytes are staged.
  return cuda_check(cudaMemcpyAsync(paged_dev_.p, staging_.data(), len * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_),
                    "uploading the KV block tables and slot maps");
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
    kl.pos = nullptr;
    kl.blocks = nullptr;
    if (kl.n_slots > 0) {
      auto* base = static_cast<int32_t*>(paged_dev_.p);
      kl.pos = base + map_at_[size_t(l)];
      kl.blocks = base + table_at_[size_t(group_of(l))];
    }
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
