// cuda_kv_cache.h — the KV cache in device memory (engine/kv_cache.h's storage hook).
//
// Per layer K and V, each [Hkv][n_slots] rows of kv_row_bytes(type, D) bytes in the K / V
// type, and the slot -> position map [n_slots] int32: a device copy of the engine's map. The K/V store kernels write the
// entries of the positions they store (so a replayed decode graph keeps it current);
// relayout() moves rows between slots with device copies and uploads the whole map.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "engine/cuda/cuda_util.h"
#include "engine/kv_cache.h"
#include "kernels/kernels.h"

namespace kvscope {

class CudaKvCache final : public KvCache {
 public:
  CudaKvCache(const KvCacheConfig& config, cudaStream_t stream);
  // f32, f16, q8_0 and q4_0 K/V types (the kernels read and write every combination);
  // others are an Error.
  static Expected<std::unique_ptr<KvCache>> create(const KvCacheConfig& config, int capacity,
                                                   cudaStream_t stream);
  // What the kernels need to address `layer`.
  kvscope::cuda::KvLayer layer(int l) const;

 protected:
  Status relayout(int layer, int n_slots, const std::vector<int32_t>& from) override;

 private:
  cudaStream_t stream_;
  std::vector<DeviceBuffer> k_, v_;  // per layer [Hkv][n_slots][D]
  std::vector<DeviceBuffer> pos_;    // per layer [n_slots] int32
  std::vector<int> slots_;
};

}  // namespace kvscope
