// kv_positions.h — fills a KV cache with rows that name their position, for the cache
// tests: position p's K row is all p + 1 and its V row all -(p + 1), so a row's L2 norm
// says where it came from.
#pragma once

#include <gtest/gtest.h>

#include "engine/backend.h"
#include "engine/kv_cache.h"

namespace kvscope::test {

// Writes positions pos0 .. pos0+T-1 into every layer of `cache`.
inline void write_positions(Backend& be, KvCache& cache, int pos0, int T) {
  const int width = cache.shape().n_head_kv * cache.shape().head_dim;
  ASSERT_TRUE(cache.begin(pos0, T).ok());
  auto k = be.scratch(0, T, width);
  auto v = be.scratch(1, T, width);
  ASSERT_TRUE(k.ok() && v.ok());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < width; ++i) {
      k->data[t * width + i] = float(pos0 + t + 1);
      v->data[t * width + i] = -float(pos0 + t + 1);
    }
  for (int l = 0; l < cache.shape().n_layer; ++l)
    ASSERT_TRUE(be.kv_write(cache, l, *k, *v, pos0).ok());
  ASSERT_TRUE(cache.end().ok());
}

}  // namespace kvscope::test
