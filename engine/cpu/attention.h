// attention.h — the CPU backend's grouped-query attention over the KV cache (the
// arithmetic and work split are described in attention.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_kv_cache.h"
#include "engine/cpu/thread_pool.h"

namespace kvscope::cpu {

// A run of keys [begin, end) in a layer's ascending key list.
struct AttnRange {
  int begin = 0, end = 0;
};

// Buffers kept between calls.
struct AttentionScratch {
  std::vector<int32_t> order;                  // held slots, ascending position
  std::vector<int32_t> key_pos;                // their positions
  std::vector<std::vector<AttnRange>> chunks;  // per (query, KV head): its chunks
  std::vector<std::pair<int, int>> items;      // (pair, chunk) work items
  std::vector<size_t> first;                   // per pair: its first item
  std::vector<float> parts;                    // per item: the chunk's results
  std::vector<float> q_scaled;                 // the queries times the score scale
  std::vector<int32_t> spans;                  // combine's chunk positions
  std::vector<AttnRange> last;                 // the last query's chunks
};

// Backend::attention (see engine/backend.h) on the CPU.
Status attention(ThreadPool& pool, Tensor q, const CpuKvCache& cache, int layer, int pos0,
                 int n_head, float scale, Tensor out, Tensor probs_last, AttentionScratch& scratch);

}  // namespace kvscope::cpu
