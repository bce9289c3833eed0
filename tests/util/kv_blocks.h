// kv_blocks.h — what a session's paged KV cache holds after n positions, worked out by
// hand for the tests. Positions arrive in blocks of B (SessionConfig::kv_block, 16 by
// default); KV_CACHE counts whole blocks. A layer that keeps only its window W gives a
// block back once every position in it is older than the oldest key a query at n (the
// next position) sees, n - W + 1; so it holds from the start of the block that key is in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/kv_pool.h"

namespace kvscope::test {

constexpr int kSessionBlock = 16;

struct PagedHeld {
  KvRange held;         // positions whose rows the layer's blocks hold
  uint64_t blocks = 0;  // blocks the layer's group holds
};

// A layer without sinks, after n positions: window 0 (or a layer that keeps everything).
inline PagedHeld paged_held(int n, int window, int block = kSessionBlock) {
  const int lo = window > 0 ? std::max(0, n - window + 1) : 0;
  const int first = lo / block * block;
  return {{first, n}, uint64_t(kv_blocks_for(n, block) - first / block)};
}

// The same for a layer with `sink` sinks: the blocks that hold them stay too.
struct PagedHeldSinks {
  std::vector<KvRange> held;
  uint64_t blocks = 0;
};
inline PagedHeldSinks paged_held(int n, int window, int sink, int block) {
  const PagedHeld w = paged_held(n, window, block);
  const int sink_blocks = kv_blocks_for(std::min(sink, n), block);
  if (w.held.begin <= sink_blocks * block) return {{{0, n}}, uint64_t(kv_blocks_for(n, block))};
  return {{{0, std::min(n, sink_blocks * block)}, w.held}, w.blocks + uint64_t(sink_blocks)};
}

// The bytes of those blocks for one layer.
inline uint64_t paged_layer_bytes(int n, int window, uint64_t position_bytes,
                                  int block = kSessionBlock) {
  return paged_held(n, window, block).blocks * uint64_t(block) * position_bytes;
}

}  // namespace kvscope::test
