// kv_memory.h — the KV cache memory formula.
//
// The formula (docs/design.md, the stats): bytes = 2 (K and V) × L layers × Hkv kv heads ×
// D head dim × bytes per value × positions held. Quantized types store blocks of 32
// values along D, each with an fp16 scale, so "bytes per value" includes the block
// overhead (q8_0: 34 B per 32 values, q4_0: 18 B per 32) and D must be a multiple of 32.
// K and V may use different types. A window caps the positions a layer holds (a model's
// own local layers, or sink + window); grouped-query attention is the Hkv < H saving,
// measured against one KV head per query head (Hkv = H).
//
// These are pure functions of shapes: the app's what-if panel evaluates them for this
// model and for the reference shapes, next to the bytes a run really holds
// (KvCache::bytes_used, which counts the same rows). Row sizes: kv_row_bytes (kv_cache.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/model.h"

namespace kvscope {

// The shape the formula needs. layer_window[l] > 0: layer l keeps at most that many
// positions (Gemma 3's local layers); 0 or an empty vector: every position.
struct KvMemoryShape {
  std::string name;
  int n_layer = 0;    // L
  int n_head = 0;     // H (query heads)
  int n_head_kv = 0;  // Hkv
  int head_dim = 0;   // D
  std::vector<int> layer_window;
};

// The shape of a loaded model, its windowed layers (KvPolicy::ModelWindow) included.
KvMemoryShape kv_memory_shape(const Model& m);
// Reference shapes: a 32-layer, 4096-wide model (32 heads of 128, no GQA; 512 KiB per
// token in fp16), a 70B model (80 layers, 64 query heads, 8 KV heads of 128; 320 KiB per
// token) and GPT-2 small (12 layers, 12 heads of 64; 36 KiB per token).
std::vector<KvMemoryShape> kv_reference_shapes();

struct KvMemoryOptions {
  KvTypes types;   // K and V element types
  int sink = 0;    // with window > 0: the first `sink` positions are kept too
  int window = 0;  // > 0: each layer keeps at most sink + window positions (window alone
                   // in a layer with its own window: no sinks there)
  bool one_kv_head_per_query_head = false;  // Hkv = H (what GQA/MQA saves against)
  // > 0: the cache holds whole blocks of this many positions (a paged cache over the KV
  // pool): a layer holds the blocks of its positions, a windowed one from the block of
  // the oldest key the next query sees (tokens - window + 1) on, and its sinks' blocks.
  int block = 0;
};

// Bytes one position costs in one layer (K and V rows of every kv head); 0 when D does
// not fit a chosen type's block.
uint64_t kv_bytes_per_position(const KvMemoryShape& s, const KvMemoryOptions& o);
// Bytes one position costs across all layers: 2 × L × Hkv × D × bytes per value.
uint64_t kv_bytes_per_token(const KvMemoryShape& s, const KvMemoryOptions& o);
// Positions layer l holds after `tokens` tokens: min(tokens, the layer's own window,
// sink + window).
int64_t kv_positions_held(const KvMemoryShape& s, const KvMemoryOptions& o, int layer,
                          int64_t tokens);
// Bytes the whole cache holds after `tokens` tokens (sum over layers; in whole blocks when
// o.block > 0).
uint64_t kv_bytes(const KvMemoryShape& s, const KvMemoryOptions& o, int64_t tokens);

}  // namespace kvscope
