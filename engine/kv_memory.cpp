// kv_memory.cpp — KV cache element sizes and the memory formula (see kv_memory.h).
#include "engine/kv_memory.h"

#include <algorithm>

#include "engine/forward.h"

namespace kvscope {

KvMemoryShape kv_memory_shape(const Model& m) {
  const ModelConfig& c = m.config();
  KvMemoryShape s;
  s.name = c.name;
  s.n_layer = c.n_layer;
  s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv;
  s.head_dim = c.head_dim;
  // What the engine's own cache layout keeps per layer.
  const KvCacheConfig cfg = kv_cache_config(m, KvTypes{}, KvPolicy::ModelWindow);
  for (const KvLayerRule& r : cfg.layers)
    s.layer_window.push_back(r.keep > 0 ? r.sink + r.keep : 0);
  return s;
}

std::vector<KvMemoryShape> kv_reference_shapes() {
  return {
      {"32 layers, 4096 wide (32 heads of 128, no GQA)", 32, 32, 32, 128, {}},
      {"70B (80 layers, 64 query heads, 8 KV heads of 128)", 80, 64, 8, 128, {}},
      {"GPT-2 small (12 layers, 12 heads of 64)", 12, 12, 12, 64, {}},
  };
}

uint64_t kv_bytes_per_position(const KvMemoryShape& s, const KvMemoryOptions& o) {
  const uint64_t k = kv_row_bytes(o.types.k, s.head_dim), v = kv_row_bytes(o.types.v, s.head_dim);
  if (k == 0 || v == 0) return 0;
  const uint64_t heads = uint64_t(o.one_kv_head_per_query_head ? s.n_head : s.n_head_kv);
  return heads * (k + v);
}

uint64_t kv_bytes_per_token(const KvMemoryShape& s, const KvMemoryOptions& o) {
  return uint64_t(s.n_layer) * kv_bytes_per_position(s, o);
}

int64_t kv_positions_held(const KvMemoryShape& s, const KvMemoryOptions& o, int layer,
                          int64_t tokens) {
  int64_t held = std::max<int64_t>(tokens, 0);
  const bool own =
      layer >= 0 && size_t(layer) < s.layer_window.size() && s.layer_window[size_t(layer)] > 0;
  if (own) held = std::min<int64_t>(held, s.layer_window[size_t(layer)]);
  // A layer with its own window keeps no sinks (kv_limits_apply).
  if (o.window > 0) held = std::min<int64_t>(held, int64_t(own ? 0 : o.sink) + o.window);
  return held;
}

uint64_t kv_bytes(const KvMemoryShape& s, const KvMemoryOptions& o, int64_t tokens) {
  const uint64_t per = kv_bytes_per_position(s, o);
  uint64_t total = 0;
  tokens = std::max<int64_t>(tokens, 0);
  for (int l = 0; l < s.n_layer; ++l) {
    if (o.block <= 0) {
      total += uint64_t(kv_positions_held(s, o, l, tokens)) * per;
      continue;
    }
    const int64_t B = o.block, all = (tokens + B - 1) / B;
    const bool own =
        size_t(l) < s.layer_window.size() && s.layer_window[size_t(l)] > 0;
    int64_t w = own ? s.layer_window[size_t(l)] : 0;
    if (o.window > 0) w = w > 0 ? std::min<int64_t>(w, o.window) : o.window;
    int64_t blocks = all;
    if (w > 0) {
      const int64_t first = std::max<int64_t>(0, tokens - w + 1) / B;
      const int64_t sinks = (std::min<int64_t>(own ? 0 : o.sink, tokens) + B - 1) / B;
      blocks = first <= sinks ? all : sinks + all - first;
    }
    total += uint64_t(blocks * B) * per;
  }
  return total;
}

}  // namespace kvscope
