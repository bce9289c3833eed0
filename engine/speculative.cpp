// speculative.cpp — drafters, the sampler's distribution and the acceptance rule (see
// speculative.h).
#include "engine/speculative.h"

#include <algorithm>
#include <cctype>
#include <numeric>

#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/sampler.h"

namespace kvscope {
namespace {

int32_t argmax(const std::vector<float>& v) {
  return argmax_first(v);
}

double uniform(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(int max_ngram) : max_ngram_(std::max(1, max_ngram)) {}
  std::string name() const override { return "ngram"; }
  Status propose(const std::vector<int32_t>& seq, int k, const SamplerConfig&, std::mt19937_64&,
                 std::vector<int32_t>& draft, std::vector<std::vector<float>>& q) override {
    draft.clear();
    q.clear();
    const int n = int(seq.size());
    for (int g = std::min(max_ngram_, n - 1); g >= 1 && draft.empty(); --g) {
      // The latest earlier occurrence of the last g tokens that has a continuation.
      for (int i = n - g - 1; i >= 0; --i) {
        if (!std::equal(seq.begin() + i, seq.begin() + i + g, seq.end() - g)) continue;
        for (int j = i + g; j < n && int(draft.size()) < k; ++j) draft.push_back(seq[size_t(j)]);
        break;
      }
    }
    q.assign(draft.size(), {});
    return Status::Ok();
  }

 private:
  int max_ngram_;
};

class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(std::shared_ptr<const Model> model, std::unique_ptr<Backend> own, Backend* be,
               int layers)
      : model_(std::move(model)), own_(std::move(own)), be_(own_ ? own_.get() : be),
        layers_(layers) {}

  Status init(KvTypes types, int context) {
    const ModelConfig& c = model_->config();
    if (layers_ < 1 || layers_ > c.n_layer)
      return make_error("speculative: early-exit:", layers_, " is outside 1..", c.n_layer - 1,
                        " (the model has ", c.n_layer, " layers)");
    KvCacheConfig cfg = kv_cache_config(*model_, types, KvPolicy::Full);
    cfg.shape.n_layer = layers_;
    cfg.layers.resize(size_t(layers_));
    const KvLayerGroups groups = kv_layer_groups(cfg);
    KvPoolConfig pc{{groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim}, types, 16, 0};
    pc.n_blocks = kv_blocks_for(context, 16) * groups.count();
    auto pool = be_->create_kv_pool(pc);
    if (!pool.ok()) return pool.error();
    auto cache = be_->create_paged_kv_cache(cfg, *pool);
    if (!cache.ok()) return cache.error();
    cache_ = std::move(*cache);
    pool_ = std::move(*pool);
    return Status::Ok();
  }

  std::string name() const override {
    return layers_ < model_->config().n_layer ? "early-exit:" + std::to_string(layers_)
                                              : "draft:" + model_->config().name;
  }
  uint64_t flops() const override { return flops_; }

  Status propose(const std::vector<int32_t>& seq, int k, const SamplerConfig& sampler,
                 std::mt19937_64& rng, std::vector<int32_t>& draft,
                 std::vector<std::vector<float>>& q) override {
    draft.clear();
    q.clear();
    if (seq.empty() || k <= 0) return Status::Ok();
    // Keep what the cache holds of the sequence; the last token always runs (its logits).
    size_t common = 0;
    while (common < seen_.size() && common + 1 < seq.size() && seen_[common] == seq[common])
      ++common;
    if (int(common) < cache_->length()) KV_TRY(cache_->truncate(int(common)));
    seen_.assign(seq.begin(), seq.begin() + int64_t(common));
    KV_TRY(forward(*be_, *model_, seq.data() + common, int(seq.size() - common), int(common),
                   *cache_, out_));
    flops_ += out_.flops;
    seen_.insert(seen_.end(), seq.begin() + int64_t(common), seq.end());
    const bool greedy = sampler.temperature <= 0;
    for (int j = 0; j < k; ++j) {
      std::vector<float> dist = sampling_distribution(out_.logits, sampler);
      const int32_t t = greedy ? argmax(dist) : draw(dist, rng);
      draft.push_back(t);
      q.push_back(greedy ? std::vector<float>{} : std::move(dist));
      if (j + 1 == k) break;
      KV_TRY(forward(*be_, *model_, &t, 1, cache_->length(), *cache_, out_));
      flops_ += out_.flops;
      seen_.push_back(t);
    }
    return Status::Ok();
  }

 private:
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> own_;
  Backend* be_ = nullptr;
  int layers_ = 0;
  std::shared_ptr<KvPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> seen_;  // the tokens whose rows the cache holds, then the last one
  ForwardOutput out_;
  uint64_t flops_ = 0;
};

}  // namespace

Expected<SpeculativeConfig> speculative_parse(const std::string& text) {
  SpeculativeConfig c;
  const auto fail = [&] {
    return make_error("--speculative: '", text,
                      "' is not one of ngram, early-exit:L (the first L layers) or draft:PATH");
  };
  if (text == "ngram") {
    c.kind = DraftKind::Ngram;
  } else if (text.rfind("early-exit:", 0) == 0) {
    const std::string n = text.substr(11);
    if (n.empty() || n.size() > 6 || !std::all_of(n.begin(), n.end(), ::isdigit)) return fail();
    c.kind = DraftKind::EarlyExit;
    c.layers = std::stoi(n);
  } else if (text.rfind("draft:", 0) == 0 && text.size() > 6) {
    c.kind = DraftKind::Model;
    c.draft_path = text.substr(6);
  } else {
    return fail();
  }
  return c;
}

std::string speculative_name(const SpeculativeConfig& c) {
  switch (c.kind) {
    case DraftKind::None: return "none";
    case DraftKind::Ngram: return "ngram";
    case DraftKind::EarlyExit: return "early-exit:" + std::to_string(c.layers);
    case DraftKind::Model: return "draft:" + c.draft_path;
  }
  return "none";
}

std::vector<float> sampling_distribution(const std::vector<float>& logits, const SamplerConfig& s) {
  std::vector<float> out(logits.size(), 0.0f);
  if (logits.empty()) return out;
  if (s.temperature <= 0) {
    out[size_t(argmax(logits))] = 1.0f;
    return out;
  }
  // The ids Sampler::sample draws from.
  const std::vector<float> p = softmax_with_temperature(logits, s.temperature);
  const std::vector<int32_t> ids = sampler_kept_ids(p, s);
  double total = 0;
  for (int32_t id : ids) total += p[size_t(id)];
  for (int32_t id : ids) out[size_t(id)] = float(p[size_t(id)] / total);
  return out;
}

int32_t draw(const std::vector<float>& p, std::mt19937_64& rng) {
  double total = 0;
  for (float v : p) total += v;
  const double u = uniform(rng) * total;
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    cum += p[i];
    last = int32_t(i);
    if (u < cum) return int32_t(i);
  }
  return last;
}

Verdict speculative_accept(const std::vector<int32_t>& draft,
                           const std::vector<std::vector<float>>& q,
                           const std::vector<std::vector<float>>& p, bool greedy,
                           std::mt19937_64& rng) {
  const int k = int(draft.size());
  for (int i = 0; i < k; ++i) {
    const int32_t x = draft[size_t(i)];
    const std::vector<float>& pi = p[size_t(i)];
    if (greedy) {
      const int32_t best = argmax(pi);
      if (best != x) return {i, best};
      continue;
    }
    const bool lookup = q[size_t(i)].empty();
    const double qx = lookup ? 1.0 : double(q[size_t(i)][size_t(x)]);
    const double px = double(pi[size_t(x)]);
    if (qx > 0 && uniform(rng) * qx < px) continue;  // kept with probability min(1, p/q)
    // Rejected: the next token from max(0, p - q), renormalized.
    std::vector<float> r(pi.size());
    double sum = 0;
    for (size_t j = 0; j < pi.size(); ++j) {
      const float qj = lookup ? (int32_t(j) == x ? 1.0f : 0.0f) : q[size_t(i)][j];
      r[j] = std::max(0.0f, pi[j] - qj);
      sum += r[j];
    }
    return {i, sum > 0 ? draw(r, rng) : draw(pi, rng)};
  }
  return {k, greedy ? argmax(p[size_t(k)]) : draw(p[size_t(k)], rng)};
}

std::unique_ptr<Drafter> make_ngram_drafter(int max_ngram) {
  return std::make_unique<NgramDrafter>(max_ngram);
}

Expected<std::unique_ptr<Drafter>> make_model_drafter(std::shared_ptr<const Model> model,
                                                      Backend* backend, int layers, KvTypes types,
                                                      int context) {
  if (!model || !backend) return make_error("speculative: no draft model or backend");
  const int L = model->config().n_layer;
  if (layers < 0 || layers >= L)
    return make_error("speculative: early-exit:", layers, " is outside 1..", L - 1,
                      " (the model has ", L, " layers)");
  auto d = std::make_unique<ModelDrafter>(std::move(model), nullptr, backend, layers == 0 ? L : layers);
  KV_TRY(d->init(types, context));
  return std::unique_ptr<Drafter>(std::move(d));
}

Expected<std::unique_ptr<Drafter>> make_model_drafter(std::shared_ptr<const Model> model,
                                                      std::unique_ptr<Backend> backend,
                                                      KvTypes types, int context) {
  if (!model || !backend) return make_error("speculative: no draft model or backend");
  const int L = model->config().n_layer;
  auto d = std::make_unique<ModelDrafter>(std::move(model), std::move(backend), nullptr, L);
  KV_TRY(d->init(types, context));
  return std::unique_ptr<Drafter>(std::move(d));
}

Status check_same_vocabulary(const Model& target, const Model& draft) {
  const Tokenizer &a = target.tokenizer(), &b = draft.tokenizer();
  if (a.n_vocab() != b.n_vocab())
    return make_error("draft: the draft model's vocabulary has ", b.n_vocab(),
                      " tokens, the target's ", a.n_vocab(), " (they must be the same vocabulary)");
  for (int32_t i = 0; i < a.n_vocab(); ++i)
    if (a.token_str(i) != b.token_str(i))
      return make_error("draft: token ", i, " is '", a.token_str(i), "' in the target but '",
                        b.token_str(i), "' in the draft model (they must be the same vocabulary)");
  return Status::Ok();
}

}  // namespace kvscope
