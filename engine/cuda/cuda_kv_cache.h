// cuda_kv_cache.h — the KV cache in device memory (engine/kv_cache.h's storage hook).
//
// Per layer K and V, each [Hkv][n_slots] rows of kv_row_bytes(type, D) bytes in the K / V
// type, and the slot -> position map [n_slots] int32: a device copy of the engine's map. The K/V
// store kernels write the entries of the positions they store (so a replayed decode graph keeps it
// current); relayout() moves rows between slots with device copies and uploads the whole map. A
// paged cache (over a CudaKvPool: per layer K and V, each [Hkv][n_blocks * B] rows) keeps a device
// copy of its block tables and slot maps in one buffer, refreshed by paged_changed() with one copy;
// the kernels reach its rows through the table (kernels/kv_layout.cuh, kv_row).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "engine/cuda/cuda_util.h"
#include "engine/kv_cache.h"
#include "engine/kv_pool.h"
#include "kernels/kernels.h"

namespace kvscope {

// The block pool's device storage.
class CudaKvPool final : public KvPool {
 public:
  static Expected<std::shared_ptr<KvPool>> create(const KvPoolConfig& config, cudaStream_t stream);
  void* k(int layer) const { return k_[size_t(layer)].p; }
  void* v(int layer) const { return v_[size_t(layer)].p; }
  int rows() const { return n_blocks() * block_size(); }  // rows per kv head

 protected:
  Status do_copy_block(int dst, int src) override;
  Status do_move_rows(const std::vector<RowMove>& moves) override;

 private:
  CudaKvPool(const KvPoolConfig& c, cudaStream_t stream) : KvPool(c), stream_(stream) {}
  cudaStream_t stream_;
  std::vector<DeviceBuffer> k_, v_;  // per layer [Hkv][rows][row bytes]
  DeviceBuffer bases_;               // k_ and v_'s pointers, layer by layer, for copy_
  kvscope::cuda::KvPoolCopy copy_;   // what kv_copy_block and kv_move_rows need
  DeviceBuffer moves_;               // a context shift's moves, uploaded for kv_move_rows
  std::vector<kvscope::cuda::KvRowMove> staged_moves_;
};

class CudaKvCache final : public KvCache {
 public:
  CudaKvCache(const KvCacheConfig& config, cudaStream_t stream,
              std::shared_ptr<KvPool> pool = nullptr);
  // A paged cache over `pool` (a CudaKvPool).
  static Expected<std::unique_ptr<KvCache>> create_paged(const KvCacheConfig& config,
                                                         std::shared_ptr<KvPool> pool,
                                                         cudaStream_t stream);
  // f32, f16, q8_0 and q4_0 K/V types (the kernels read and write every combination);
  // others are an Error.
  static Expected<std::unique_ptr<KvCache>> create(const KvCacheConfig& config, int capacity,
                                                   cudaStream_t stream);
  // What the kernels need to address `layer`.
  kvscope::cuda::KvLayer layer(int l) const;
  // Changes whenever a device pointer or slot count layer() returns may have changed
  // (a relayout, a new block table or slot map upload); never repeats, in any cache.
  uint64_t version() const { return version_; }

 protected:
  Status relayout(int layer, int n_slots, const std::vector<int32_t>& from) override;
  Status paged_changed(PagedChange change) override;

 private:
  cudaStream_t stream_;
  const CudaKvPool* cuda_pool_ = nullptr;  // paged only
  // Paged only: every group's block table, then every layer's slot map, each padded to
  // the slots its group's device copy covers (group_slots_); int32 offsets in table_at_
  // (per group) and map_at_ (per layer). The tables come first, so that growth within
  // those slots uploads them alone.
  DeviceBuffer paged_dev_;
  std::vector<int> group_slots_;
  std::vector<size_t> table_at_, map_at_;
  size_t tables_len_ = 0, paged_len_ = 0;  // int32s of the tables, of everything
  std::vector<int32_t> staging_;           // what is uploaded
  std::vector<DeviceBuffer> k_, v_;  // per layer [Hkv][n_slots][D]
  std::vector<DeviceBuffer> pos_;    // per layer [n_slots] int32
  std::vector<int> slots_;
  uint64_t version_ = 0;
};

}  // namespace kvscope
