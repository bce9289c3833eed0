// forward.h — the transformer forward pass of every family, written once against Backend.
//
// forward() runs T tokens at positions pos0 .. pos0+T-1 (in batches of at most 512) through
// every block, storing their K/V into `cache` (whose length() must be pos0), and returns the
// logits of the last token, the last query's attention rows and per-layer K/V row
// norms. FLOPs are counted here from the shapes executed, so every backend reports the
// same numbers: 2 per multiply-add of every weight matmul and of attention (q.k and p.v).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "common/status.h"

namespace kvscope {

// How a forward hands over the last query's attention rows (computed either way).
enum class RowsCopy {
  Wait,   // downloaded before the forward returns
  Async,  // copy started (Backend::download_async): valid after Backend::download_wait()
  None,   // left in backend memory, not copied (nobody asked for them)
};

struct ForwardOutput {
  std::vector<float> logits;     // [V], for the last token
  std::vector<float> attention;  // [L][H][pos0+T], last query's softmax rows
  std::vector<float> k_norm;     // [L][T], L2 norm of each written K row
  std::vector<float> v_norm;     // [L][T]
  // In: measure the written rows' quantization error (where the backend can).
  bool want_kv_errors = false;
  // In: the logits of every token, [T][V] (T at most 512), instead of the last one's.
  bool want_all_logits = false;
  // In: leave the last token's logits in backend memory (logits_dev) instead of
  // downloading them into `logits` (which stays empty); not with want_all_logits.
  bool logits_on_device = false;
  // In: how the attention rows reach `attention`.
  RowsCopy attention_copy = RowsCopy::Wait;
  // Out, with logits_on_device: the row [1][V] in backend memory, until the next forward.
  Tensor logits_dev;
  std::vector<float> k_err, v_err;  // [L][T] when measured (Backend::kv_row_errors), else empty
  uint64_t flops = 0;
  uint64_t kv_rows = 0;          // T * L
};

// The cache layout for `model`: per layer its attention window (from the model) and,
// under KvPolicy::ModelWindow, a ring holding only what that window can see.
KvCacheConfig kv_cache_config(const Model& model, KvTypes types, KvPolicy policy);

// Keys a query at query_pos sees under rule r.
uint64_t visible_keys(const KvLayerRule& r, int query_pos);
// FLOPs of one forward over T tokens starting at pos0 with the given per-layer rules
// (closed form; see file comment).
uint64_t forward_flops(const Model& model, const std::vector<KvLayerRule>& rules, int T,
                       int pos0);

Status forward(Backend& backend, const Model& model, const int32_t* tokens, int T, int pos0,
               KvCache& cache, ForwardOutput& out);

// One sequence's part of a batched forward: T tokens at positions cache->length() ..,
// stored into its own cache.
struct BatchSeq {
  KvCache* cache = nullptr;
  const int32_t* tokens = nullptr;
  int T = 0;
  bool logits = true;      // the last token's logits
  bool attention = false;  // the last query's attention rows
  bool norms = false;      // the written K/V rows' norms
  bool kv_errors = false;  // and their quantization error (where the backend measures it)
  bool all_logits = false;  // every token's logits instead, [T][V] (speculative verification)
  bool logits_on_device = false;        // the last token's logits left in backend memory
  RowsCopy attention_copy = RowsCopy::Wait;  // how the attention rows are handed over
};
struct BatchSeqOutput {
  std::vector<float> logits;         // [V] when asked ([T][V] with all_logits)
  Tensor logits_dev;                 // [1][V] in backend memory, with logits_on_device
  std::vector<float> attention;      // [L][H][pos0+T] when asked
  std::vector<float> k_norm, v_norm;  // [L][T] when asked
  std::vector<float> k_err, v_err;    // [L][T] when asked and measured
  uint64_t flops = 0;                // this sequence's share (its LM head only when asked)
};
// The most tokens one forward_batch takes.
inline constexpr int kMaxBatchTokens = 4096;

// One forward pass over several sequences at once: the weight products run over every
// sequence's rows together; RoPE, the K/V store and attention run per sequence over its
// own cache (paged or not). Sequences whose T is 1 and that want logits, when adjacent,
// share one LM-head product. A sequence's results are those of the same tokens run
// through forward() alone, bit for bit on the CPU (every product and the attention are
// batch-invariant). On an error no cache has recorded the new positions.
// The caches' layer count (the same for all) is how many blocks run: a cache of the first
// L' < L layers runs those and then the final norm and LM head (an early-exit draft).
Status forward_batch(Backend& backend, const Model& model, const std::vector<BatchSeq>& seqs,
                     std::vector<BatchSeqOutput>& out);

// The RoPE of `layer` (its style, rotated dims, base and position scale).
RopeSpec layer_rope(const Model& model, int layer);

// llama.cpp's context shift on `cache`: forgets positions [first, first + n) in every
// layer, renumbers the later ones by -n (KvCache::shift) and re-rotates their K rows by -n
// with each layer's RoPE (Backend::kv_rerotate). On an error the cache is lost.
Status kv_shift(Backend& backend, const Model& model, KvCache& cache, int first, int n);

}  // namespace kvscope
