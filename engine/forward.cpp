// forward.cpp — the transformer forward pass over Backend ops (see forward.h), one for
// every family: what differs is read from the model description (model.h).
//
// x = token_embd[ids]·embd_scale. Per block l:
//   h = RMSNorm(x)·attn_norm; q,k,v = Wq·h, Wk·h, Wv·h (+ biases);
//   per-head RMSNorm of q and k (qk_norm); RoPE(q,k) with the layer's style and base;
//   store k,v; a = attention(q, cache) (the layer's window, attn_scale);
//   o = Wo·a (RMSNorm·post_attention_norm); x += o; h = RMSNorm(x)·ffn_norm;
//   f = Wdown(act(Wgate·h) ⊙ Wup·h) (RMSNorm·post_ffw_norm); x += f.
// Then RMSNorm·output_norm and the LM head on the last token only. Ops go through the
// backend's fused entry points (backend.h), equal to the plain sequence above (unfused_<op>).
//
// More than kMaxBatch tokens go through in batches of kMaxBatch: a windowed layer's ring
// then never holds more than keep - 1 + kMaxBatch positions (a 2,000-token prompt does
// not make Gemma 3's local caches full-size for a moment) and the activation scratch stays
// bounded whatever the prompt length. Each token's result does not depend on the batch it
// is in (the CPU backend's products and attention are batch-invariant), so batching leaves
// CACHE and NO CACHE bit-identical.
#include "engine/forward.h"

#include <algorithm>
#include <cmath>

namespace kvscope {
namespace {

// Scratch slots of the backend.
enum Slot : int { kX, kH, kQ, kK, kV, kAtt, kGate, kUp, kOut, kLogits, kProbs, kNorms };

constexpr int kMaxBatch = 512;

// Tokens t0 .. t0+n-1 of a forward over T tokens. The last batch also gives the logits and
// attention rows of the last token; every batch writes its K/V row norms into columns
// t0.. of out.k_norm / v_norm ([L][T]).
struct Batch {
  int t0, n, T;
  bool last;
};

// One batch: b.n tokens at pos0.. through the blocks into the cache (begun by the caller).
Status run_blocks(Backend& be, const Model& model, const int32_t* tokens, int pos0,
                  const Batch& b, KvCache& cache, ForwardOutput& out);

}  // namespace

KvCacheConfig kv_cache_config(const Model& model, KvTypes types, KvPolicy policy) {
  const ModelConfig& c = model.config();
  KvCacheConfig cfg = kv_config_full({c.n_layer, c.n_head_kv, c.head_dim}, types);
  for (int l = 0; l < c.n_layer; ++l) {
    KvLayerRule& r = cfg.layers[size_t(l)];
    r.window = c.layers[size_t(l)].window;
    r.keep = policy == KvPolicy::ModelWindow ? r.window : 0;
  }
  return cfg;
}

uint64_t visible_keys(const KvLayerRule& r, int query_pos) {
  const uint64_t all = uint64_t(query_pos) + 1;
  if (r.window == 0 || all <= uint64_t(r.window)) return all;
  // The last `window` keys, plus sinks older than them.
  return uint64_t(r.window) + std::min<uint64_t>(uint64_t(r.sink), all - uint64_t(r.window));
}

uint64_t forward_flops(const Model& model, const std::vector<KvLayerRule>& rules, int T,
                       int pos0) {
  const ModelConfig& c = model.config();
  uint64_t macs = uint64_t(T) * model.block_macs_per_token();
  macs += uint64_t(c.n_embd) * uint64_t(c.n_vocab);  // LM head, last token
  // Attention: each query reads the keys its layer's rule makes visible; q·k and p·v are
  // D MACs each, per head.
  uint64_t keys = 0;
  for (const KvLayerRule& r : rules)
    for (int t = 0; t < T; ++t) keys += visible_keys(r, pos0 + t);
  macs += keys * 2ull * uint64_t(c.head_dim) * uint64_t(c.n_head);
  return 2 * macs;
}

RopeSpec layer_rope(const Model& model, int layer) {
  const ModelConfig& c = model.config();
  const LayerConfig& lc = c.layers[size_t(layer)];
  return RopeSpec{c.rope_style, c.n_rot, lc.rope_base, lc.rope_freq_scale};
}

Status kv_shift(Backend& be, const Model& model, KvCache& cache, int first, int n) {
  KV_TRY(cache.shift(first, n));
  for (int l = 0; l < cache.shape().n_layer; ++l)
    KV_TRY(be.kv_rerotate(cache, l, layer_rope(model, l), first, -n));
  return Status::Ok();
}

Status forward(Backend& be, const Model& model, const int32_t* tokens, int T, int pos0,
               KvCache& cache, ForwardOutput& out) {
  const ModelConfig& c = model.config();
  const int L = c.n_layer;
  if (T <= 0) return make_error("forward: no tokens to process");
  const KvShape& ks = cache.shape();
  if (ks.n_layer != L || ks.n_head_kv != c.n_head_kv || ks.head_dim != c.head_dim)
    return make_error("forward: the cache is shaped ", ks.n_layer, " layers x ", ks.n_head_kv,
                      " kv heads x ", ks.head_dim, " dims, the model ", L, " x ", c.n_head_kv,
                      " x ", c.head_dim);
  if (cache.length() != pos0)
    return make_error("forward: the cache holds ", cache.length(), " positions but position ",
                      pos0, " was asked for");
  out.k_norm.assign(size_t(L) * T, 0.0f);
  out.v_norm.assign(size_t(L) * T, 0.0f);
  const bool errs = out.want_kv_errors && be.can_measure_kv_errors();
  out.k_err.assign(errs ? size_t(L) * T : 0, 0.0f);
  out.v_err.assign(errs ? size_t(L) * T : 0, 0.0f);
  for (int t0 = 0; t0 < T; t0 += kMaxBatch) {
    const Batch b{t0, std::min(kMaxBatch, T - t0), T, t0 + kMaxBatch >= T};
    KV_TRY(cache.begin(pos0 + b.t0, b.n));
    Status s = run_blocks(be, model, tokens + b.t0, pos0 + b.t0, b, cache, out);
    if (!s.ok()) {
      cache.cancel();
      return s;
    }
    KV_TRY(cache.end());
  }
  std::vector<KvLayerRule> rules;
  for (int l = 0; l < L; ++l) rules.push_back(cache.rule(l));
  out.flops = forward_flops(model, rules, T, pos0);
  out.kv_rows = uint64_t(T) * uint64_t(L);
  return Status::Ok();
}

namespace {

Status run_blocks(Backend& be, const Model& model, const int32_t* tokens, int pos0,
                  const Batch& b, KvCache& cache, ForwardOutput& out) {
  const int T = b.n;
  const ModelConfig& c = model.config();
  const int C = c.n_embd, D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, F = c.n_ff,
            L = c.n_layer, V = c.n_vocab;
  const int n_keys = pos0 + T;

  auto slot = [&](int s, int64_t rows, int64_t cols) { return be.scratch(s, rows, cols); };
  auto x = slot(kX, T, C);
  if (!x.ok()) return x.error();
  auto h = slot(kH, T, C);
  if (!h.ok()) return h.error();
  auto q = slot(kQ, T, H * D);
  if (!q.ok()) return q.error();
  auto k = slot(kK, T, Hkv * D);
  if (!k.ok()) return k.error();
  auto v = slot(kV, T, Hkv * D);
  if (!v.ok()) return v.error();
  auto att = slot(kAtt, T, H * D);
  if (!att.ok()) return att.error();
  auto gate = slot(kGate, T, F);
  if (!gate.ok()) return gate.error();
  auto up = slot(kUp, T, F);
  if (!up.ok()) return up.error();
  auto o = slot(kOut, T, C);
  if (!o.ok()) return o.error();
  auto logits = slot(kLogits, 1, V);
  if (!logits.ok()) return logits.error();
  auto probs = slot(kProbs, int64_t(L) * H, n_keys);  // [L*H][n_keys]
  if (!probs.ok()) return probs.error();
  // Rows 0..L-1 K norms, L..2L-1 V norms; when measured, 2L..3L-1 K errors, 3L..4L-1 V.
  const bool errs = !out.k_err.empty();
  auto norms = slot(kNorms, (errs ? 4 : 2) * int64_t(L), T);
  if (!norms.ok()) return norms.error();

  // The residual add that closes each block is fused with the norm that opens the next
  // one (and with output_norm after the last block).
  KV_TRY(be.embed(model.tok_embd(), tokens, c.embd_scale, *x));
  KV_TRY(be.rmsnorm(*x, model.layers()[0].attn_norm, c.rms_eps, *h));
  for (int l = 0; l < L; ++l) {
    const LayerWeights& w = model.layers()[size_t(l)];
    const LayerConfig& lc = c.layers[size_t(l)];
    KV_TRY(be.matmul_qkv(w.wq, w.wk, w.wv, *h, *q, *k, *v));
    if (c.qkv_bias) {
      KV_TRY(be.add_bias(*q, w.bq));
      KV_TRY(be.add_bias(*k, w.bk));
      KV_TRY(be.add_bias(*v, w.bv));
    }
    if (c.qk_norm) {  // each head's D values, viewed as rows of [T*heads][D]
      const Tensor qh{q->data, int64_t(T) * H, D}, kh{k->data, int64_t(T) * Hkv, D};
      KV_TRY(be.rmsnorm(qh, w.q_norm, c.rms_eps, qh));
      KV_TRY(be.rmsnorm(kh, w.k_norm, c.rms_eps, kh));
    }
    const RopeSpec rope{c.rope_style, c.n_rot, lc.rope_base, lc.rope_freq_scale};
    if (errs) {  // unfused, so that k holds the rotated f32 rows the cache stored
      KV_TRY(be.rope(*q, H, D, rope, pos0));
      KV_TRY(be.rope(*k, Hkv, D, rope, pos0));
      KV_TRY(be.kv_write(cache, l, *k, *v, pos0));
      KV_TRY(
          be.kv_row_errors(cache, l, pos0, *k, *v, norms->row(2 * L + l), norms->row(3 * L + l)));
    } else {
      KV_TRY(be.rope_kv_write(*q, *k, *v, cache, l, H, rope, pos0));
    }
    KV_TRY(be.kv_row_norms(cache, l, pos0, T, norms->row(l), norms->row(L + l)));
    Tensor probs_l = probs->row_range(int64_t(l) * H, H);
    KV_TRY(be.attention(*q, cache, l, pos0, H, c.attn_scale, *att, probs_l));
    KV_TRY(be.matmul(w.wo, *att, *o));
    if (c.post_attn_norm) KV_TRY(be.rmsnorm(*o, w.post_attn_norm, c.rms_eps, *o));
    KV_TRY(be.add_rmsnorm(*x, *o, w.ffn_norm, c.rms_eps, *h));
    KV_TRY(be.matmul_glu(w.w_gate, w.w_up, *h, c.ffn_act, *gate, *up));
    KV_TRY(be.matmul(w.w_down, *gate, *o));
    if (c.post_ffn_norm) KV_TRY(be.rmsnorm(*o, w.post_ffn_norm, c.rms_eps, *o));
    const Weight& next_norm = l + 1 < L ? model.layers()[size_t(l) + 1].attn_norm : model.output_norm();
    KV_TRY(be.add_rmsnorm(*x, *o, next_norm, c.rms_eps, *h));
  }
  // Every launch before the first download (a decode step's CUDA graph ends there).
  if (b.last) {
    KV_TRY(be.matmul(model.output(), h->row(T - 1), *logits));
    out.logits.resize(size_t(V));
    out.attention.resize(size_t(L) * H * n_keys);
    KV_TRY(be.download(*logits, out.logits.data()));
    KV_TRY(be.download(*probs, out.attention.data()));
  }
  std::vector<float> norm_host(size_t((errs ? 4 : 2) * L) * T);
  KV_TRY(be.download(*norms, norm_host.data()));
  for (int l = 0; l < L; ++l) {
    const auto row = [&](int r) { return norm_host.begin() + int64_t(r) * T; };
    std::copy_n(row(l), T, out.k_norm.begin() + int64_t(l) * b.T + b.t0);
    std::copy_n(row(L + l), T, out.v_norm.begin() + int64_t(l) * b.T + b.t0);
    if (!errs) continue;
    std::copy_n(row(2 * L + l), T, out.k_err.begin() + int64_t(l) * b.T + b.t0);
    std::copy_n(row(3 * L + l), T, out.v_err.begin() + int64_t(l) * b.T + b.t0);
  }
  return Status::Ok();
}

}  // namespace

}  // namespace kvscope
