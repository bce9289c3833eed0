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
// backend's fused entry points (backend.h), equal to the plain sequence above (unfused_<op>):
// each half of a block (norm_qkv_kv_write, norm_ffn) opens with the residual add of the
// previous half's product and the norm, so a CUDA decode step is 4 launches per layer.
//
// forward_batch runs several sequences' tokens through one pass: the rows of all of them
// go through the weight products together, and each sequence's rows meet RoPE, its cache
// and attention on their own, except that consecutive decode rows on paged caches of one
// pool meet them together through the rows ops (Backend::rope_kv_write_rows,
// attention_rows: one launch per layer on the GPU). forward() is that pass for one sequence.
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

// Where sequence i's rows and outputs sit in the pass's shared tensors.
struct SeqRows {
  int r0 = 0, T = 0, pos0 = 0;
  int logit_row = -1;       // row of the logits tensor, -1 when not asked
  int logit_rows = 0;       // 1, or T with all_logits
  int64_t probs_at = -1;    // offset into the probs tensor, -1 when not asked
  bool errs = false;
};

// Runs of consecutive decode rows that go through the rows ops together (run_batch).
struct DecodeRun {
  size_t i0 = 0, i1 = 0;         // sequences [i0, i1)
  std::vector<KvCache*> caches;  // [i1 - i0]
  std::vector<int> pos;          // [i1 - i0]
};

// The host-side bookkeeping of a pass, kept from call to call on each thread so that a
// steady decode step allocates nothing (tests/engine/test_decode_allocations.cpp): the
// vectors keep their capacity, and each call overwrites what it reads. forward() uses the
// first three, forward_batch() rows and rules (after forward()'s call to it returns, so
// the two never hold rules at once), run_batch() the rest.
struct PassScratch {
  std::vector<BatchSeq> one_seq;        // forward(): its batch of one
  std::vector<BatchSeqOutput> one_out;  // forward(): that batch's outputs
  std::vector<KvLayerRule> rules;       // the FLOP count's per-layer rules
  std::vector<SeqRows> rows;            // forward_batch(): where each sequence's rows sit
  std::vector<int32_t> ids;             // run_batch(): every token id, in row order
  std::vector<DecodeRun> runs;          // run_batch(): its runs of decode rows (the first ones)
  std::vector<float> norm_host;         // run_batch(): the row norms downloaded
};
thread_local PassScratch scratch;

// The key count to make room for in a sequence's attention rows: `keys` rounded up to a
// whole 256. The rows' buffers then grow once every 256 decode steps, not at every step.
int room_for(int keys) { return (keys + 255) / 256 * 256; }

Status run_batch(Backend& be, const Model& model, const std::vector<BatchSeq>& seqs,
                 const std::vector<SeqRows>& rows, int total, std::vector<BatchSeqOutput>& out);

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
  // The blocks that run (every layer has the same weight shapes): all of them, or the
  // first rules.size() of an early-exit draft.
  const uint64_t blocks = model.block_macs_per_token();
  uint64_t macs = uint64_t(T) * (int(rules.size()) == c.n_layer
                                     ? blocks
                                     : blocks / uint64_t(c.n_layer) * uint64_t(rules.size()));
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
  const int L = cache.shape().n_layer;  // the model's, or an early-exit draft's fewer
  if (T <= 0) return make_error("forward: no tokens to process");
  if (out.want_all_logits && T > kMaxBatch)
    return make_error("forward: every token's logits for at most ", kMaxBatch, " tokens, not ", T);
  if (cache.length() != pos0)
    return make_error("forward: the cache holds ", cache.length(), " positions but position ",
                      pos0, " was asked for");
  out.k_norm.assign(size_t(L) * T, 0.0f);
  out.v_norm.assign(size_t(L) * T, 0.0f);
  const bool errs = out.want_kv_errors && be.can_measure_kv_errors();
  out.k_err.assign(errs ? size_t(L) * T : 0, 0.0f);
  out.v_err.assign(errs ? size_t(L) * T : 0, 0.0f);
  std::vector<BatchSeq>& batch = scratch.one_seq;
  std::vector<BatchSeqOutput>& part = scratch.one_out;
  batch.resize(1);
  part.resize(1);
  for (int t0 = 0; t0 < T; t0 += kMaxBatch) {
    const int n = std::min(kMaxBatch, T - t0);
    const bool last = t0 + kMaxBatch >= T;
    BatchSeq seq{&cache, tokens + t0, n, last, last, true, errs};
    seq.all_logits = last && out.want_all_logits;
    seq.logits_on_device = last && out.logits_on_device && !out.want_all_logits;
    seq.attention_copy = out.attention_copy;
    BatchSeqOutput& p = part[0];
    if (last) {  // the caller's vectors, so that their capacity is reused
      p.logits.swap(out.logits);
      p.attention.swap(out.attention);
    }
    batch[0] = seq;
    Status st = forward_batch(be, model, batch, part);
    if (!st.ok()) {  // the caller's vectors back, with what they held
      if (last) {
        out.logits.swap(p.logits);
        out.attention.swap(p.attention);
      }
      return st;
    }
    for (int l = 0; l < L; ++l) {
      const auto at = [&](const std::vector<float>& v) { return v.begin() + int64_t(l) * n; };
      const int64_t dst = int64_t(l) * T + t0;
      std::copy_n(at(p.k_norm), n, out.k_norm.begin() + dst);
      std::copy_n(at(p.v_norm), n, out.v_norm.begin() + dst);
      if (!errs) continue;
      std::copy_n(at(p.k_err), n, out.k_err.begin() + dst);
      std::copy_n(at(p.v_err), n, out.v_err.begin() + dst);
    }
    if (last) {
      out.logits.swap(p.logits);
      out.attention.swap(p.attention);
      out.logits_dev = p.logits_dev;
    }
  }
  std::vector<KvLayerRule>& rules = scratch.rules;
  rules.clear();
  for (int l = 0; l < L; ++l) rules.push_back(cache.rule(l));
  out.flops = forward_flops(model, rules, T, pos0);
  out.kv_rows = uint64_t(T) * uint64_t(L);
  return Status::Ok();
}

Status forward_batch(Backend& be, const Model& model, const std::vector<BatchSeq>& seqs,
                     std::vector<BatchSeqOutput>& out) {
  const ModelConfig& c = model.config();
  if (seqs.empty()) return make_error("forward: no sequences to process");
  if (!seqs[0].cache) return make_error("forward: sequence 0 of the batch has no cache");
  const int L = seqs[0].cache->shape().n_layer, H = c.n_head;
  std::vector<SeqRows>& rows = scratch.rows;
  rows.assign(seqs.size(), SeqRows{});
  int total = 0, n_logits = 0;
  int64_t probs = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const BatchSeq& s = seqs[i];
    if (!s.cache || !s.tokens || s.T <= 0)
      return make_error("forward: sequence ", i, " of the batch has no tokens or no cache");
    const KvShape& ks = s.cache->shape();
    if (ks.n_layer != L || L < 1 || L > c.n_layer || ks.n_head_kv != c.n_head_kv ||
        ks.head_dim != c.head_dim)
      return make_error("forward: the cache is shaped ", ks.n_layer, " layers x ", ks.n_head_kv,
                        " kv heads x ", ks.head_dim, " dims, the model ", c.n_layer, " x ",
                        c.n_head_kv, " x ", c.head_dim);
    for (size_t j = 0; j < i; ++j)
      if (seqs[j].cache == s.cache)
        return make_error("forward: sequences ", j, " and ", i, " of the batch share a cache");
    for (int t = 0; t < s.T; ++t)
      if (s.tokens[t] < 0 || s.tokens[t] >= c.n_vocab)
        return make_error("forward: token id ", s.tokens[t], " is outside the vocabulary of ",
                          c.n_vocab);
    SeqRows& r = rows[i];
    r.r0 = total;
    r.T = s.T;
    r.pos0 = s.cache->length();
    r.errs = s.kv_errors && be.can_measure_kv_errors();
    if (s.logits || s.all_logits) {
      r.logit_row = n_logits;
      r.logit_rows = s.all_logits ? s.T : 1;
      n_logits += r.logit_rows;
    }
    if (s.attention) {
      r.probs_at = probs;
      probs += int64_t(L) * H * (r.pos0 + s.T);
    }
    total += s.T;
  }
  if (total > kMaxBatchTokens)
    return make_error("forward: ", total, " tokens in one batch, at most ", kMaxBatchTokens);
  size_t begun = 0;
  Status st = Status::Ok();
  for (; begun < seqs.size() && st.ok(); ++begun) {
    st = seqs[begun].cache->begin(rows[begun].pos0, rows[begun].T);
    if (!st.ok()) break;
  }
  if (st.ok()) st = run_batch(be, model, seqs, rows, total, out);
  if (!st.ok()) {
    for (size_t i = 0; i < begun; ++i) seqs[i].cache->cancel();
    return st;
  }
  for (const BatchSeq& s : seqs) KV_TRY(s.cache->end());
  std::vector<KvLayerRule>& rules = scratch.rules;
  for (size_t i = 0; i < seqs.size(); ++i) {
    rules.clear();
    for (int l = 0; l < L; ++l) rules.push_back(seqs[i].cache->rule(l));
    out[i].flops = forward_flops(model, rules, rows[i].T, rows[i].pos0);
    const uint64_t head = 2ull * uint64_t(c.n_embd) * uint64_t(c.n_vocab);
    if (rows[i].logit_rows == 0) out[i].flops -= head;
    if (rows[i].logit_rows > 1) out[i].flops += uint64_t(rows[i].logit_rows - 1) * head;
  }
  return Status::Ok();
}

namespace {

Status run_batch(Backend& be, const Model& model, const std::vector<BatchSeq>& seqs,
                 const std::vector<SeqRows>& rows, int T, std::vector<BatchSeqOutput>& out) {
  const ModelConfig& c = model.config();
  const int C = c.n_embd, D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, F = c.n_ff,
            L = seqs[0].cache->shape().n_layer, V = c.n_vocab;
  const size_t N = seqs.size();
  int n_logits = 0;
  int64_t n_probs = 0;  // room for each sequence's rows (room_for), so that the tensor
  bool errs = false;    // does not grow at every step
  for (size_t i = 0; i < N; ++i) {
    n_logits += rows[i].logit_rows;
    if (rows[i].probs_at >= 0)
      n_probs += int64_t(L) * H * room_for(rows[i].pos0 + rows[i].T);
    errs = errs || rows[i].errs;
  }
  // Every token's ids, in row order (host memory the embed reads until the first download).
  std::vector<int32_t>& ids = scratch.ids;
  ids.clear();
  for (const BatchSeq& s : seqs) ids.insert(ids.end(), s.tokens, s.tokens + s.T);

  auto slot = [&](int s, int64_t r, int64_t cols) { return be.scratch(s, r, cols); };
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
  auto logits = slot(kLogits, std::max(1, n_logits), V);
  if (!logits.ok()) return logits.error();
  auto probs = slot(kProbs, 1, std::max<int64_t>(1, n_probs));  // each sequence's [L*H][keys]
  if (!probs.ok()) return probs.error();
  // Rows 0..L-1 K norms, L..2L-1 V norms; when measured, 2L..3L-1 K errors, 3L..4L-1 V.
  auto norms = slot(kNorms, (errs ? 4 : 2) * int64_t(L), T);
  if (!norms.ok()) return norms.error();
  // Columns r0 .. r0+n of norm row `r`.
  const auto norm_cols = [&](int r, const SeqRows& sr) {
    return Tensor{norms->data + int64_t(r) * T + sr.r0, 1, sr.T};
  };

  // Runs of consecutive decode rows (one token each) whose caches are paged over one pool,
  // with no attention rows or quantization errors asked: their RoPE + K/V store and their
  // attention go through the rows ops, one call per layer for the whole run (one launch
  // on the GPU instead of one per sequence). Everything else goes sequence by sequence.
  std::vector<DecodeRun>& runs = scratch.runs;  // the first n_runs of them
  size_t n_runs = 0;
  const auto decode_row = [&](size_t i) {
    return rows[i].T == 1 && rows[i].probs_at < 0 && !rows[i].errs && seqs[i].cache->paged();
  };
  for (size_t i = 0; i < N;) {
    size_t j = i + 1;
    if (decode_row(i))
      while (j < N && decode_row(j) && seqs[j].cache->pool() == seqs[i].cache->pool()) ++j;
    if (j - i >= 2 && decode_row(i)) {
      if (n_runs == runs.size()) runs.emplace_back();
      DecodeRun& r = runs[n_runs++];
      r.i0 = i;
      r.i1 = j;
      r.caches.clear();
      r.pos.clear();
      for (size_t m = i; m < j; ++m) {
        r.caches.push_back(seqs[m].cache);
        r.pos.push_back(rows[m].pos0);
      }
    }
    i = j;
  }

  // Each half of a block opens with the residual step (backend.h ResidualNorm): the
  // previous half's product (after its post norm, Gemma) is added to x and x is normed
  // for the products that follow. The attention half of a single sequence's rows goes
  // through norm_qkv_kv_write (residual step, q/k/v products, biases, q/k norms, RoPE,
  // K/V store, row norms: one launch per decode step on CUDA), the feed-forward half of
  // every row through norm_ffn (residual step, gate/up, down: one launch). So a decode
  // step on CUDA issues per layer: norm_qkv_kv_write, attention (split over key chunks,
  // merged in the same launch), Wo, norm_ffn — 4 launches; plus embed, the final
  // add + output_norm and the LM head (4 L + 3; Gemma's last post_ffw_norm adds one).
  // Several sequences' rows (or K/V errors asked) take the separate ops instead.
  const bool fused_attn_in = N == 1 && !rows[0].errs;
  Tensor y{};                         // the previous half's product (o), null before layer 0
  const Weight* y_norm = nullptr;     // its post norm
  KV_TRY(be.embed(model.tok_embd(), ids.data(), c.embd_scale, *x));
  for (int l = 0; l < L; ++l) {
    const LayerWeights& w = model.layers()[size_t(l)];
    const LayerConfig& lc = c.layers[size_t(l)];
    const RopeSpec rope{c.rope_style, c.n_rot, lc.rope_base, lc.rope_freq_scale};
    const ResidualNorm attn_in{*x, y, y_norm, &w.attn_norm, c.rms_eps, *h};
    QkvStore a;
    a.wq = &w.wq;
    a.wk = &w.wk;
    a.wv = &w.wv;
    if (c.qkv_bias) {
      a.bq = &w.bq;
      a.bk = &w.bk;
      a.bv = &w.bv;
    }
    if (c.qk_norm) {
      a.q_norm = &w.q_norm;
      a.k_norm = &w.k_norm;
    }
    a.q = *q;
    a.k = *k;
    a.v = *v;
    a.n_head = H;
    if (fused_attn_in) {
      a.cache = seqs[0].cache;
      a.layer = l;
      a.rope = rope;
      a.pos0 = rows[0].pos0;
      if (seqs[0].norms) {
        a.k_row_norm = norm_cols(l, rows[0]);
        a.v_row_norm = norm_cols(L + l, rows[0]);
      }
      KV_TRY(be.norm_qkv_kv_write(attn_in, a));
    } else {
      KV_TRY(be.norm_qkv(attn_in, a));  // RoPE and the store follow per sequence
    }
    size_t next_run = 0;
    for (size_t i = 0; i < N; ++i) {
      if (next_run < n_runs && runs[next_run].i0 == i) {
        const DecodeRun& run = runs[next_run++];
        const int n = int(run.i1 - run.i0);
        const DecodeRows dr{run.caches.data(), run.pos.data(), n};
        const int64_t r0 = rows[i].r0;
        KV_TRY(be.rope_kv_write_rows(q->row_range(r0, n), k->row_range(r0, n), v->row_range(r0, n),
                                     dr, l, H, rope));
        for (size_t m = run.i0; m < run.i1; ++m)
          if (seqs[m].norms)
            KV_TRY(be.kv_row_norms(*seqs[m].cache, l, rows[m].pos0, 1, norm_cols(l, rows[m]),
                                   norm_cols(L + l, rows[m])));
        KV_TRY(
            be.attention_rows(q->row_range(r0, n), dr, l, H, c.attn_scale, att->row_range(r0, n)));
        i = run.i1 - 1;
        continue;
      }
      const SeqRows& sr = rows[i];
      KvCache& cache = *seqs[i].cache;
      const Tensor qi = q->row_range(sr.r0, sr.T), ki = k->row_range(sr.r0, sr.T),
                   vi = v->row_range(sr.r0, sr.T);
      if (!fused_attn_in) {  // (else norm_qkv_kv_write stored the rows and took their norms)
        if (sr.errs) {  // unfused, so that k holds the rotated f32 rows the cache stored
          KV_TRY(be.rope(qi, H, D, rope, sr.pos0));
          KV_TRY(be.rope(ki, Hkv, D, rope, sr.pos0));
          KV_TRY(be.kv_write(cache, l, ki, vi, sr.pos0));
          KV_TRY(be.kv_row_errors(cache, l, sr.pos0, ki, vi, norm_cols(2 * L + l, sr),
                                  norm_cols(3 * L + l, sr)));
        } else {
          KV_TRY(be.rope_kv_write(qi, ki, vi, cache, l, H, rope, sr.pos0));
        }
        if (seqs[i].norms)
          KV_TRY(be.kv_row_norms(cache, l, sr.pos0, sr.T, norm_cols(l, sr), norm_cols(L + l, sr)));
      }
      const int64_t keys = sr.pos0 + sr.T;
      const Tensor probs_l = sr.probs_at >= 0
                                 ? Tensor{probs->data + sr.probs_at + int64_t(l) * H * keys, H, keys}
                                 : Tensor{};
      KV_TRY(be.attention(qi, cache, l, sr.pos0, H, c.attn_scale, att->row_range(sr.r0, sr.T),
                          probs_l));
    }
    KV_TRY(be.matmul(w.wo, *att, *o));
    const ResidualNorm ffn_in{*x, *o, c.post_attn_norm ? &w.post_attn_norm : nullptr, &w.ffn_norm,
                              c.rms_eps, *h};
    KV_TRY(be.norm_ffn(ffn_in, FfnWeights{&w.w_gate, &w.w_up, &w.w_down, c.ffn_act}, *gate, *up,
                       *o));
    y = *o;
    y_norm = c.post_ffn_norm ? &w.post_ffn_norm : nullptr;
  }
  KV_TRY(be.residual_norm(ResidualNorm{*x, y, y_norm, &model.output_norm(), c.rms_eps, *h}));
  // The LM head on each sequence's last row; adjacent one-token sequences (decode rows,
  // consecutive in h) share one product.
  for (size_t i = 0; i < N;) {
    if (rows[i].logit_row < 0) {
      ++i;
      continue;
    }
    if (rows[i].logit_rows > 1) {  // every row of this sequence
      KV_TRY(be.matmul(model.output(), h->row_range(rows[i].r0, rows[i].T),
                       logits->row_range(rows[i].logit_row, rows[i].T)));
      ++i;
      continue;
    }
    size_t j = i + 1;
    if (rows[i].T == 1)
      while (j < N && rows[j].T == 1 && rows[j].logit_rows == 1 &&
             rows[j].logit_row == rows[j - 1].logit_row + 1)
        ++j;
    const int64_t last_row = rows[i].r0 + rows[i].T - 1;
    KV_TRY(be.matmul(model.output(), h->row_range(last_row, int64_t(j - i)),
                     logits->row_range(rows[i].logit_row, int64_t(j - i))));
    i = j;
  }
  // Every launch before the first download (a decode step's CUDA graph ends there).
  // Each sequence's results go straight into its own vectors, whose capacity a caller
  // may hand in (forward() does: a decode step then allocates nothing).
  out.resize(N);
  for (size_t i = 0; i < N; ++i) {
    BatchSeqOutput& o = out[i];
    const bool on_device = seqs[i].logits_on_device && rows[i].logit_rows == 1;
    o.logits.resize(on_device ? 0 : size_t(rows[i].logit_rows) * size_t(V));
    o.logits_dev = on_device ? logits->row(rows[i].logit_row) : Tensor{};
    const bool copy_attn = rows[i].probs_at >= 0 && seqs[i].attention_copy != RowsCopy::None;
    const size_t n_attn = copy_attn ? size_t(L) * H * size_t(rows[i].pos0 + rows[i].T) : 0;
    // A vector the caller reuses grows by whole steps of keys (room_for); a fresh one (the
    // session hands each step's rows on) gets what it holds.
    if (n_attn > o.attention.capacity())
      o.attention.reserve(o.attention.capacity() == 0
                              ? n_attn
                              : size_t(L) * H * size_t(room_for(rows[i].pos0 + rows[i].T)));
    o.attention.resize(n_attn);
    o.k_norm.clear();
    o.v_norm.clear();
    o.k_err.clear();
    o.v_err.clear();
  }
  // The logits rows the host asked for, each sequence's straight into its vector. One
  // sequence's: one download. Several: a copy started for each (download_async: on the
  // CPU a copy there and then; on CUDA queued copies into the backend's pinned staging,
  // reused from step to step) and one wait for them all, so a batched step neither
  // allocates a staging buffer nor waits for the device once per sequence. Rows that stay
  // on the device are not copied. (No copy is pending here: a caller that starts
  // attention-row copies waits for them within the same step, session.cpp.)
  const auto to_host = [&](size_t i) { return rows[i].logit_row >= 0 && !out[i].logits_dev.data; };
  int n_to_host = 0;
  for (size_t i = 0; i < N; ++i) n_to_host += to_host(i) ? 1 : 0;
  Status copied = Status::Ok();
  for (size_t i = 0; i < N && copied.ok(); ++i) {
    if (!to_host(i)) continue;
    const Tensor src = logits->row_range(rows[i].logit_row, rows[i].logit_rows);
    copied = n_to_host == 1 ? be.download(src, out[i].logits.data())
                            : be.download_async(src, out[i].logits.data());
  }
  if (n_to_host > 1) {  // after a failed start too: no copy is left pending into `out`
    const Status waited = be.download_wait();
    if (copied.ok()) copied = waited;
  }
  KV_TRY(copied);
  for (size_t i = 0; i < N; ++i) {
    if (rows[i].probs_at < 0 || seqs[i].attention_copy == RowsCopy::None) continue;
    const Tensor rows_i{probs->data + rows[i].probs_at, 1, int64_t(out[i].attention.size())};
    if (seqs[i].attention_copy == RowsCopy::Async)
      KV_TRY(be.download_async(rows_i, out[i].attention.data()));
    else
      KV_TRY(be.download(rows_i, out[i].attention.data()));
  }
  bool any_norms = false;
  for (const BatchSeq& s : seqs) any_norms = any_norms || s.norms || s.kv_errors;
  if (!any_norms) return Status::Ok();
  std::vector<float>& norm_host = scratch.norm_host;
  norm_host.resize(size_t((errs ? 4 : 2) * L) * T);
  KV_TRY(be.download(*norms, norm_host.data()));
  for (size_t i = 0; i < N; ++i) {
    const SeqRows& sr = rows[i];
    BatchSeqOutput& so = out[i];
    const auto take = [&](int first_row, std::vector<float>& dst) {
      dst.resize(size_t(L) * sr.T);
      for (int l = 0; l < L; ++l)
        std::copy_n(norm_host.begin() + int64_t(first_row + l) * T + sr.r0, sr.T,
                    dst.begin() + int64_t(l) * sr.T);
    };
    if (seqs[i].norms) {
      take(0, so.k_norm);
      take(L, so.v_norm);
    }
    if (sr.errs) {
      take(2 * L, so.k_err);
      take(3 * L, so.v_err);
    }
  }
  return Status::Ok();
}

}  // namespace

}  // namespace kvscope
