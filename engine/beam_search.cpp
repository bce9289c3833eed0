// beam_search.cpp — beam search over the paged KV pool (see beam_search.h).
#include "engine/beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/session.h"

namespace kvscope {
namespace {

struct Beam {
  std::unique_ptr<KvCache> cache;  // every token but the newest
  std::vector<int32_t> gen;        // generated tokens (the newest not in the cache yet)
  double logprob = 0;
};

}  // namespace

double beam_score(double logprob, int length, float length_penalty) {
  return logprob / std::pow(double(std::max(length, 1)), double(length_penalty));
}

void beam_candidates(const float* logits, int V, int keep,
                     std::vector<std::pair<int32_t, double>>& out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < V; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int i = 0; i < V; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) ids[size_t(i)] = i;
  const size_t k = std::min<size_t>(size_t(std::max(keep, 0)), ids.size());
  // Log p is monotone in the logit: rank by the logits, ties to the lower id.
  std::partial_sort(ids.begin(), ids.begin() + int64_t(k), ids.end(), [&](int32_t x, int32_t y) {
    return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
  });
  out.clear();
  for (size_t i = 0; i < k; ++i) out.push_back({ids[i], double(logits[ids[i]]) - lse});
}

bool beam_can_beat(double logprob, int length, int max_tokens, float length_penalty,
                   double best) {
  const int bound_len = length_penalty > 0 ? max_tokens : length;
  return beam_score(logprob, bound_len, length_penalty) > best;
}

Expected<BeamResult> beam_search(const Model& model, Backend& be,
                                 const std::vector<int32_t>& prompt, const BeamConfig& cfg) {
  const ModelConfig& c = model.config();
  const int K = cfg.beams, V = c.n_vocab;
  if (K < 1 || K > 1024) return make_error("beams: ", K, " is outside 1..1024");
  if (cfg.max_tokens < 1) return make_error("beams: max tokens ", cfg.max_tokens, " (at least 1)");
  if (!kv_block_size_ok(cfg.block_size))
    return make_error("kv-block: ", cfg.block_size, " positions per block is not one of ",
                      kv_block_size_choices());
  if (prompt.empty()) return make_error("beams: the prompt has no tokens");
  const int total = int(prompt.size()) + cfg.max_tokens;
  if (total > c.n_ctx)
    return make_error("beams: the prompt (", prompt.size(), " tokens) and ", cfg.max_tokens,
                      " tokens need ", total, " positions; the context holds ", c.n_ctx);
  const KvCacheConfig kc = kv_cache_config(model, cfg.kv_types, KvPolicy::Full);
  const KvLayerGroups groups = kv_layer_groups(kc);
  const int B = cfg.block_size;
  KvPoolConfig pc{{groups.size, kc.shape.n_head_kv, kc.shape.head_dim}, cfg.kv_types, B, 0};
  // The prompt's blocks once, and each beam's own blocks; twice over while a step's new
  // beams and their parents both hold theirs.
  pc.n_blocks = groups.count() * (kv_blocks_for(int(prompt.size()), B) +
                                  2 * K * (kv_blocks_for(cfg.max_tokens, B) + 1));
  auto pool = be.create_kv_pool(pc);
  if (!pool.ok()) return pool.error();
  const auto new_cache = [&]() -> Expected<std::unique_ptr<KvCache>> {
    return be.create_paged_kv_cache(kc, *pool);
  };
  const std::vector<int32_t> end_ids = generation_end_ids(model.tokenizer());
  const auto ends = [&](int32_t t) {
    return cfg.stop_at_eos && std::binary_search(end_ids.begin(), end_ids.end(), t);
  };

  BeamResult res;
  BeamStats& st = res.stats;
  st.block_bytes = kv_block_bytes(pc);
  std::vector<Hypothesis> finished;
  const auto record_pool = [&](const std::vector<Beam>& beams) {
    int held = 0;
    for (const Beam& b : beams) held += b.cache->held_blocks();
    st.peak_unshared_blocks = std::max(st.peak_unshared_blocks, held);
    st.peak_blocks = std::max(st.peak_blocks, (*pool)->counts().used);
  };

  // The prompt, once: its logits give the first tokens.
  auto root = new_cache();
  if (!root.ok()) return root.error();
  ForwardOutput fo;
  KV_TRY(forward(be, model, prompt.data(), int(prompt.size()), 0, **root, fo));
  std::vector<Beam> beams(1);
  beams[0].cache = std::move(*root);
  std::vector<std::vector<float>> logits{std::move(fo.logits)};
  std::vector<std::pair<int32_t, double>> top;
  struct Cand {
    double logprob;
    int parent;
    int32_t token;
  };
  for (int step = 0;; ++step) {
    // Every live beam's continuations; the 2K best are enough for K live ones.
    std::vector<Cand> cands;
    for (size_t b = 0; b < beams.size(); ++b) {
      beam_candidates(logits[b].data(), V, 2 * K, top);
      for (const auto& [id, l] : top) cands.push_back({beams[b].logprob + l, int(b), id});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& x, const Cand& y) {
      return x.logprob > y.logprob;
    });
    const int len = step + 1;  // generated tokens once this step's is appended
    std::vector<Cand> next;
    for (const Cand& cd : cands) {
      if (int(next.size()) == K) break;
      if (ends(cd.token)) {
        Hypothesis h;
        h.tokens = beams[size_t(cd.parent)].gen;
        h.tokens.push_back(cd.token);
        h.logprob = cd.logprob;
        h.score = beam_score(cd.logprob, len, cfg.length_penalty);
        h.finished = true;
        finished.push_back(std::move(h));
        continue;
      }
      next.push_back(cd);
    }
    // Done: the length reached, or no live beam can beat the best finished hypothesis.
    double best_finished = -std::numeric_limits<double>::infinity();
    for (const Hypothesis& h : finished) best_finished = std::max(best_finished, h.score);
    bool can_beat = false;
    for (const Cand& cd : next)
      can_beat = can_beat ||
                 beam_can_beat(cd.logprob, len, cfg.max_tokens, cfg.length_penalty, best_finished);
    if (len >= cfg.max_tokens || next.empty() || !can_beat) {
      for (const Cand& cd : next) {
        Hypothesis h;
        h.tokens = beams[size_t(cd.parent)].gen;
        h.tokens.push_back(cd.token);
        h.logprob = cd.logprob;
        h.score = beam_score(cd.logprob, len, cfg.length_penalty);
        finished.push_back(std::move(h));
      }
      break;
    }
    // The new beams fork their parents' blocks; parents nobody continues are released.
    std::vector<Beam> fresh(next.size());
    std::vector<char> continued(beams.size(), 0);
    for (size_t i = 0; i < next.size(); ++i) {
      const Beam& parent = beams[size_t(next[i].parent)];
      continued[size_t(next[i].parent)] = 1;
      auto cache = new_cache();
      if (!cache.ok()) return cache.error();
      std::vector<std::vector<int32_t>> tables;
      for (int g = 0; g < parent.cache->n_groups(); ++g) tables.push_back(parent.cache->blocks(g));
      KV_TRY((*cache)->adopt_groups(tables, parent.cache->length()));
      fresh[i].cache = std::move(*cache);
      fresh[i].gen = parent.gen;
      fresh[i].gen.push_back(next[i].token);
      fresh[i].logprob = next[i].logprob;
    }
    for (char used : continued) st.pruned += !used;
    beams = std::move(fresh);  // the parents' references go back here
    // One forward of every beam's newest token.
    std::vector<BatchSeq> batch(beams.size());
    for (size_t i = 0; i < beams.size(); ++i) {
      batch[i].cache = beams[i].cache.get();
      batch[i].tokens = &beams[i].gen.back();
      batch[i].T = 1;
    }
    std::vector<BatchSeqOutput> out;
    KV_TRY(forward_batch(be, model, batch, out));
    ++st.steps;
    logits.assign(beams.size(), {});
    for (size_t i = 0; i < beams.size(); ++i) {
      logits[i] = std::move(out[i].logits);
      st.cow_copies += beams[i].cache->cow_copies();
    }
    record_pool(beams);
  }
  std::stable_sort(finished.begin(), finished.end(),
                   [](const Hypothesis& x, const Hypothesis& y) { return x.score > y.score; });
  if (int(finished.size()) > K) finished.resize(size_t(K));
  res.hypotheses = std::move(finished);
  return res;
}

}  // namespace kvscope
