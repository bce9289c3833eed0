// attention.h — the CPU backend's grouped-query attention over the KV cache.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_kv_cache.h"
#include "engine/cpu/thread_pool.h"

namespace kvscope::cpu {

// Buffers kept between calls.
struct AttentionScratch {
  std::vector<float> kv_f32;     // the fp32 copy of one layer's held K/V
  std::vector<int32_t> key_pos;  // their positions, ascending
};

// Backend::attention (see engine/backend.h) on the CPU.
Status attention(ThreadPool& pool, Tensor q, const CpuKvCache& cache, int layer, int pos0,
                 int n_head, float scale, Tensor out, Tensor probs_last, AttentionScratch& scratch);

}  // namespace kvscope::cpu
