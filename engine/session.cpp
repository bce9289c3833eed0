// session.cpp — the generation loop (see session.h).
#include "engine/session.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "engine/device_sampling.h"
#include "engine/forward.h"

namespace kvscope {
namespace {

// Bytes made displayable: valid UTF-8 kept, every invalid or incomplete sequence as U+FFFD.
std::string display_text(std::string_view bytes) {
  Utf8Stream stream;
  std::string out = stream.push(bytes);
  return out + stream.flush();
}

}  // namespace

const char* cache_mode_name(CacheMode m) { return m == CacheMode::Cache ? "cache" : "nocache"; }

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::None: return "none";
    case StopReason::Eos: return "eos";
    case StopReason::MaxTokens: return "max_tokens";
    case StopReason::StopString: return "stop_string";
    case StopReason::ContextFull: return "context_full";
    case StopReason::StopToken: return "stop_token";
    case StopReason::Pruned: return "pruned";
    case StopReason::SearchDone: return "search_done";
  }
  return "none";
}

Expected<std::unique_ptr<Session>> Session::create(std::shared_ptr<const Model> model,
                                                   std::unique_ptr<Backend> backend,
                                                   SessionConfig config) {
  if (!model) return make_error("session: no model");
  if (!backend) return make_error("session: no backend");
  if (config.max_tokens < 1)
    return make_error("session: max_tokens ", config.max_tokens, " must be at least 1");
  for (KvDtype t : {config.kv_types.k, config.kv_types.v})
    if (kv_row_bytes(t, model->config().head_dim) == 0)
      return make_error("kv-type: ", kv_dtype_name(t),
                        " stores blocks of 32 values along the head dimension, but this model's "
                        "heads have ", model->config().head_dim, " dims (use f16 or f32)");
  KV_TRY(kv_limits_check(config.limits, model->config().n_ctx));
  if (config.min_tokens < 0)
    return make_error("min-tokens: ", config.min_tokens, " is negative");
  for (int32_t id : config.stop_ids)
    if (id < 0 || id >= model->config().n_vocab)
      return make_error("stop-id: token id ", id, " is outside the vocabulary [0, ",
                        model->config().n_vocab, ")");
  if (!kv_block_size_ok(config.kv_block))
    return make_error("kv-block: ", config.kv_block, " positions per block is not one of ",
                      kv_block_size_choices());
  if (config.limits.on_full == ContextPolicy::Shift && config.limits.n_keep > 0 &&
      config.kv_policy == KvPolicy::ModelWindow) {
    // A windowed layer's ring has evicted the first positions long before the context
    // fills, so a shift could not give them back to it.
    const int ctx = kv_limits_ctx(config.limits, model->config().n_ctx);
    for (const LayerConfig& lc : model->config().layers)
      if (lc.window > 0 && lc.window < ctx)
        return make_error(
            "n-keep: this model's windowed layers keep only their last ", lc.window,
            " positions, so when the ", ctx,
            "-position context fills they no longer hold the first ", config.limits.n_keep,
            " a shift would keep; use --n-keep 0, --kv-keep full or --ctx ", lc.window, " or less");
  }
  std::unique_ptr<Session> s(new Session());
  s->model_ = std::move(model);
  s->backend_ = std::move(backend);
  s->config_ = std::move(config);
  s->stop_ = StopReason::MaxTokens;  // nothing to run until reset()
  return s;
}

Session::~Session() = default;

int Session::context_limit() const {
  return kv_limits_ctx(config_.limits, model_->config().n_ctx);
}

std::vector<int32_t> generation_end_ids(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < tok.n_vocab(); ++i)
    if (tok.is_eog(i) || (tok.is_control(i) && i != tok.bos_id())) ids.push_back(i);
  return ids;
}

Expected<std::vector<int32_t>> tokenize_prompt(const Model& model, const PromptSpec& prompt) {
  const Tokenizer& tok = model.tokenizer();
  if (prompt.text.empty()) return make_error("prompt: the prompt is empty");
  size_t bad = 0;
  if (!utf8_valid(prompt.text, &bad))
    return make_error("prompt: invalid UTF-8 at byte offset ", bad,
                      " (prompts must be UTF-8 text)");
  std::string text = prompt.text;
  if (prompt.chat) {
    auto t = tok.apply_chat_template({ChatMessage{"user", prompt.text}}, true);
    if (!t.ok()) return t.error();
    text = *t;
  }
  auto ids = tok.encode(text, /*parse_special=*/prompt.chat || prompt.special);
  if (!ids.ok()) return ids.error();
  std::vector<int32_t> seq;
  if (tok.add_bos() && tok.bos_id() >= 0) seq.push_back(tok.bos_id());
  seq.insert(seq.end(), ids->begin(), ids->end());
  if (seq.empty()) return make_error("prompt: the prompt produced no tokens");
  return seq;
}

Status Session::reset(const PromptSpec& prompt) {
  auto seq = tokenize_prompt(*model_, prompt);
  if (!seq.ok()) return seq.error();
  return reset_tokens(std::move(*seq));
}

Status Session::reset_tokens(std::vector<int32_t> seq) {
  const Tokenizer& tok = model_->tokenizer();
  if (seq.empty()) return make_error("prompt: the prompt has no tokens");
  for (size_t i = 0; i < seq.size(); ++i)
    if (seq[i] < 0 || seq[i] >= model_->config().n_vocab)
      return make_error("prompt: token ", i, " has id ", seq[i], ", outside the vocabulary [0, ",
                        model_->config().n_vocab, ")");
  if (int(seq.size()) >= context_limit())
    return make_error("prompt: the prompt has ", seq.size(), " tokens but the context holds ",
                      context_limit(), "; shorten it to at most ", context_limit() - 1, " tokens");

  tokens_ = std::move(seq);
  history_ = tokens_;
  shifts_.clear();
  prompt_len_ = int(tokens_.size());
  prompt_tokens_.clear();
  for (int32_t id : tokens_) prompt_tokens_.push_back({id, display_text(tok.token_bytes(id))});
  prompt_reported_ = false;
  steps_ = 0;
  stop_ = StopReason::None;
  logits_.clear();
  logits_on_device_ = false;
  gen_bytes_.clear();
  stream_ = Utf8Stream();
  flops_total_ = kv_rows_total_ = 0;
  cache_.reset();
  sampler_.configure(sampler_cfg_);
  queue_.clear();
  spec_ = {};
  spec_rng_.seed(sampler_cfg_.seed ^ kSpeculationSeed);
  return Status::Ok();
}

void Session::set_sampler(const SamplerConfig& s) {
  sampler_cfg_ = s;
  sampler_.configure(s);
  spec_rng_.seed(s.seed ^ kSpeculationSeed);
}

Status Session::set_mode(CacheMode mode) {
  if (mode == config_.mode) return Status::Ok();
  config_.mode = mode;
  cache_.reset();  // NO_CACHE frees it; CACHE rebuilds it with one prefill on the next step
  queue_.clear();  // verified tokens not emitted yet: NO CACHE computes its own
  return Status::Ok();
}

Status Session::set_speculation(const SpeculativeConfig& c, std::shared_ptr<const Model> draft_model,
                                std::unique_ptr<Backend> draft_backend) {
  if (c.kind != DraftKind::None && (c.draft_max < 1 || c.draft_max > 15))
    return make_error("draft-max: ", c.draft_max, " is outside 1..15");
  std::unique_ptr<Drafter> d;
  const int ctx = context_limit();
  switch (c.kind) {
    case DraftKind::None:
      break;
    case DraftKind::Ngram:
      d = make_ngram_drafter();
      break;
    case DraftKind::EarlyExit: {
      if (c.layers < 1 || c.layers >= model_->config().n_layer)
        return make_error("speculative: early-exit:", c.layers, " is outside 1..",
                          model_->config().n_layer - 1, " (the model has ",
                          model_->config().n_layer, " layers)");
      auto made = make_model_drafter(model_, backend_.get(), c.layers, config_.kv_types, ctx);
      if (!made.ok()) return made.error();
      d = std::move(*made);
      break;
    }
    case DraftKind::Model: {
      if (!draft_model || !draft_backend)
        return make_error("speculative: draft: needs the draft model and a backend for it");
      KV_TRY(check_same_vocabulary(*model_, *draft_model));
      auto made = make_model_drafter(std::move(draft_model), std::move(draft_backend),
                                     config_.kv_types, ctx);
      if (!made.ok()) return made.error();
      d = std::move(*made);
      break;
    }
  }
  drafter_ = std::move(d);
  draft_max_ = c.draft_max;
  queue_.clear();
  return Status::Ok();
}

Status Session::ensure_pool(const KvCacheConfig& cfg) {
  if (pool_) return Status::Ok();
  const KvLayerGroups groups = kv_layer_groups(cfg);
  KvPoolConfig pc;
  pc.shape = {groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim};
  pc.types = cfg.types;
  pc.block_size = config_.kv_block;
  // Every position of the context in every group: what NO CACHE's scratch cache holds at
  // the end of a full context (a cache never holds more).
  pc.n_blocks = kv_blocks_for(context_limit(), pc.block_size) * groups.count();
  auto pool = backend_->create_kv_pool(pc);
  if (!pool.ok()) return pool.error();
  pool_ = std::move(*pool);
  return Status::Ok();
}

const std::vector<float>& Session::last_logits() const {
  if (logits_on_device_) {
    logits_on_device_ = false;
    logits_.resize(size_t(model_->config().n_vocab));
    if (!backend_->sampled_row(logits_.data()).ok()) logits_.clear();
  }
  return logits_;
}

uint64_t Session::kv_bytes() const { return cache_ ? cache_->bytes_used() : 0; }

std::string Session::generated_text() const { return display_text(gen_bytes_); }

Expected<StepTrace> Session::step() { return run_step(std::nullopt); }

Expected<StepTrace> Session::step_forced(int32_t id) {
  if (id < 0 || id >= model_->config().n_vocab)
    return make_error("session: forced token id ", id, " is outside the vocabulary [0, ",
                      model_->config().n_vocab, ")");
  return run_step(id);
}

Expected<StepTrace> Session::run_step(std::optional<int32_t> forced) {
  if (done())
    return make_error("session: generation has stopped (", stop_reason_name(stop_),
                      "); reset with a prompt first");
  const ModelConfig& c = model_->config();
  KvCacheConfig kv_cfg = kv_cache_config(*model_, config_.kv_types, config_.kv_policy);
  kv_limits_apply(config_.limits, kv_cfg);
  const auto t0 = std::chrono::steady_clock::now();
  const int V = c.n_vocab;

  int shift_first = 0, shift_n = 0;
  std::unique_ptr<KvCache> scratch;
  int pos0 = 0, T = 0;
  ForwardOutput fo;
  fo.logits = std::move(spare_logits_);  // its capacity: the logits land there
  fo.want_kv_errors = config_.kv_errors;
  fo.attention_copy = config_.attention_rows ? RowsCopy::Async : RowsCopy::None;
  // The attention rows' copy lands in fo.attention: waited for before fo goes, whatever
  // path leaves this function (a no-op when nothing is pending).
  struct CopyWait {
    Backend& be;
    ~CopyWait() { (void)be.download_wait(); }
  } copy_wait{*backend_};
  std::optional<DeviceSampleResult> ds;  // set when this step sampled on the device
  std::vector<float>& softmax = softmax_;  // of what the sampler saw, after temperature
  bool have_softmax = false;               // (computed)
  std::optional<double> device_ms;
  int32_t id = 0;
  bool shaped = false;
  // Speculation: what this step drafted and kept (drafted empty: none).
  std::vector<int32_t> drafted;
  int accepted = 0;
  uint64_t draft_flops = 0;
  const bool queued = !forced && !queue_.empty();
  int seq = int(tokens_.size());
  if (queued) {
    // A token a speculative step already verified: no forward of its own.
    Queued qd = std::move(queue_.front());
    queue_.pop_front();
    id = qd.id;
    logits_ = std::move(qd.raw);
    logits_on_device_ = false;
    shaped = !qd.shaped.empty();
    if (shaped) shaped_ = std::move(qd.shaped);
    pos0 = qd.pos;
    fo.k_norm = std::move(qd.k_norm);
    fo.v_norm = std::move(qd.v_norm);
  } else {
  backend_->begin_step();

  // A full context under the shift policy: drop [n_keep, n_keep + n) before the forward.
  if (config_.limits.on_full == ContextPolicy::Shift && int(tokens_.size()) >= context_limit()) {
    shift_first = config_.limits.n_keep;
    shift_n = kv_shift_discard(int(tokens_.size()), shift_first);
    if (cache_)  // holds every token but the last
      if (Status s = kv_shift(*backend_, *model_, *cache_, shift_first, shift_n); !s.ok()) {
        cache_.reset();  // the next CACHE step rebuilds it
        return s.error();
      }
    shifts_.push_back({int(history_.size()) - 1, shift_first, shift_n});
    tokens_.erase(tokens_.begin() + shift_first, tokens_.begin() + shift_first + shift_n);
  }
  seq = int(tokens_.size());

  // Speculation: with a cache that holds all but the last token, a drafter proposes up to
  // draft_max tokens (no further than the context and max_tokens allow).
  if (!forced && drafter_ && config_.mode == CacheMode::Cache && cache_ &&
      cache_->length() == seq - 1) {
    const int room = std::min({draft_max_, context_limit() - seq - 1,
                               config_.max_tokens - generated() - 1});
    if (room > 0) {
      const uint64_t before = drafter_->flops();
      Status ds = drafter_->propose(tokens_, room, sampler_cfg_, spec_rng_, drafted, draft_q_);
      if (!ds.ok()) return ds.error();
      draft_flops = drafter_->flops() - before;
      if (int(drafted.size()) > room) drafted.resize(size_t(room));
    }
  }

  // Sampling on the device: a plain step (no draft, not forced) with no logit shaping
  // (penalties, bias, held-back tokens), on a backend that can, with a sampler whose kept
  // ids the candidates can settle (dev_n > 0, device_sampling.h).
  int dev_n = 0;
  if (!forced && drafted.empty() && config_.device_sampling && backend_->can_sample_on_device() &&
      !sampler_cfg_.penalties.active() && generated() >= config_.min_tokens)
    dev_n = device_sample_candidates_needed(sampler_cfg_, config_.top_candidates, V);
  fo.logits_on_device = dev_n > 0;

  // Which tokens go through the forward, and into which cache.
  Status fs = Status::Ok();
  if (config_.mode == CacheMode::Cache && cache_ && !drafted.empty()) {
    // Verify: the last token and the draft in one forward, every row's logits. Windowed
    // layers keep their blocks until the rollback is done.
    pos0 = cache_->length();
    T = 1 + int(drafted.size());
    verify_.assign(1, tokens_.back());
    verify_.insert(verify_.end(), drafted.begin(), drafted.end());
    fo.want_all_logits = true;
    (void)cache_->hold_window_drops(true);  // holding never fails
    fs = forward(*backend_, *model_, verify_.data(), T, pos0, *cache_, fo);
  } else if (config_.mode == CacheMode::Cache && cache_) {
    // The tokens not yet in the cache (one, after the first step).
    pos0 = cache_->length();
    T = seq - pos0;
    fs = forward(*backend_, *model_, tokens_.data() + pos0, T, pos0, *cache_, fo);
  } else {
    // A new cache (CACHE) or the scratch cache of NO CACHE, which has the same masks and
    // holds every position it computes: the whole history, shifts replayed.
    KV_TRY(ensure_pool(kv_cfg));
    auto made = backend_->create_paged_kv_cache(
        config_.mode == CacheMode::Cache ? kv_cfg : kv_config_scratch(kv_cfg), pool_);
    if (!made.ok()) return made.error();
    (config_.mode == CacheMode::Cache ? cache_ : scratch) = std::move(made.value());
    fs = replay(cache_ ? *cache_ : *scratch, fo, &pos0, &T);
  }
  if (!fs.ok()) {
    cache_.reset();  // possibly half-written: the next CACHE step rebuilds it
    return fs.error();
  }

  // What the sampler sees: the model's logits after the penalties, with the tokens that
  // would end the run held back until min_tokens are generated. Row i of a verification
  // follows the first i draft tokens.
  const auto shape_row = [&](const float* raw, int i, std::vector<float>& out) {
    const bool hold_back = generated() + i < config_.min_tokens;
    if (!sampler_cfg_.penalties.active() && !hold_back) return false;
    if (hold_back && end_ids_.empty()) {
      end_ids_ = generation_end_ids(model_->tokenizer());
      end_ids_.insert(end_ids_.end(), config_.stop_ids.begin(), config_.stop_ids.end());
    }
    out.assign(raw, raw + V);
    std::vector<int32_t> hist = history_;
    hist.insert(hist.end(), drafted.begin(), drafted.begin() + i);
    shape_logits(sampler_cfg_.penalties, hist.data(), hist.size(),
                 hold_back ? end_ids_ : std::vector<int32_t>{}, out);
    return true;
  };
  if (drafted.empty() && fo.logits_dev.data) {
    // On the device: the candidates come back; the row stays there (last_logits fetches
    // it). When they cannot settle the step, the row comes back and the CPU path runs.
    DeviceCandidates dc;
    const float temp = sampler_cfg_.temperature > 0 ? sampler_cfg_.temperature : 1.0f;
    Status ss = backend_->sample_candidates(fo.logits_dev, dev_n, temp, dc);
    if (ss.ok()) ds = device_sample_resolve(dc, V, sampler_cfg_, config_.top_candidates);
    ++device_stats_.steps;
    if (ss.ok() && !ds) {
      ++device_stats_.fallbacks;
      fo.logits.resize(size_t(V));
      ss = backend_->sampled_row(fo.logits.data());
    }
    if (!ss.ok()) {
      cache_.reset();  // holds a position the sequence does not: the next step rebuilds it
      return ss.error();
    }
  }
  if (ds) {
    logits_on_device_ = true;
    shaped = false;
    id = sampler_cfg_.temperature <= 0 ? ds->kept[0] : sampler_.draw(ds->kept, ds->p_kept);
  } else if (drafted.empty()) {
    logits_.swap(fo.logits);
    spare_logits_ = std::move(fo.logits);  // the last step's buffer, for the next forward
    logits_on_device_ = false;
    shaped = shape_row(logits_.data(), 0, shaped_);
    if (forced) {
      id = *forced;
    } else if (sampler_cfg_.temperature > 0) {  // the candidates below read the same softmax
      softmax_with_temperature(shaped ? shaped_ : logits_, sampler_cfg_.temperature, softmax);
      have_softmax = true;
      id = sampler_.sample_softmax(softmax);
    } else {
      id = sampler_.sample(shaped ? shaped_ : logits_);
    }
  } else {
    // Row i's distribution decides draft token i; Leviathan's rule (or argmax, greedy).
    const int k = int(drafted.size());
    std::vector<std::vector<float>> rows_raw(size_t(k) + 1), rows_shaped(size_t(k) + 1), p(size_t(k) + 1);
    for (int i = 0; i <= k; ++i) {
      const float* raw = fo.logits.data() + int64_t(i) * V;
      rows_raw[size_t(i)].assign(raw, raw + V);
      const bool sh = shape_row(raw, i, rows_shaped[size_t(i)]);
      p[size_t(i)] = sampling_distribution(sh ? rows_shaped[size_t(i)] : rows_raw[size_t(i)],
                                           sampler_cfg_);
    }
    const Verdict v = speculative_accept(drafted, draft_q_, p, sampler_cfg_.temperature <= 0,
                                         spec_rng_);
    accepted = v.accepted;
    // Roll back the rows of the rejected draft tokens: the cache keeps the last token and
    // the accepted ones; whole blocks past them go back to the pool.
    Status rs = cache_->truncate(pos0 + 1 + accepted);
    if (rs.ok()) rs = cache_->hold_window_drops(false);
    if (!rs.ok()) {
      cache_.reset();
      return rs.error();
    }
    // This step emits the first token; the others wait in the queue, each with its row.
    const auto column = [&](const std::vector<float>& norms, int i) {
      std::vector<float> col(size_t(c.n_layer));
      for (int l = 0; l < c.n_layer; ++l) col[size_t(l)] = norms[size_t(l) * size_t(T) + size_t(i)];
      return col;
    };
    for (int i = 1; i <= accepted; ++i) {
      Queued qd;
      qd.id = i < accepted ? drafted[size_t(i)] : v.next;
      qd.raw = std::move(rows_raw[size_t(i)]);
      qd.shaped = std::move(rows_shaped[size_t(i)]);
      qd.pos = pos0 + i;
      qd.k_norm = column(fo.k_norm, i);
      qd.v_norm = column(fo.v_norm, i);
      queue_.push_back(std::move(qd));
    }
    id = accepted > 0 ? drafted[0] : v.next;
    logits_ = std::move(rows_raw[0]);
    logits_on_device_ = false;
    shaped = !rows_shaped[0].empty();
    if (shaped) shaped_ = std::move(rows_shaped[0]);
    fo.k_norm = column(fo.k_norm, 0);
    fo.v_norm = column(fo.v_norm, 0);
    fo.k_err.clear();
    fo.v_err.clear();
    fo.attention.clear();
    spec_.drafted += uint64_t(k);
    spec_.accepted += uint64_t(accepted);
    ++spec_.verify_forwards;
  }
  KV_TRY(backend_->download_wait());  // the attention rows, read below
  device_ms = backend_->end_step();
  }  // a step with a forward of its own
  const std::vector<float>& seen = shaped ? shaped_ : logits_;

  StepTrace tr;
  tr.step = ++steps_;
  tr.token_id = id;
  const Tokenizer& tok = model_->tokenizer();
  tr.piece = tok.token_bytes(id);
  tr.text = display_text(tr.piece);
  tr.pos = seq;
  tr.shift_first = shift_first;
  tr.shift_n = shift_n;
  tr.shifted_total = int(history_.size()) - int(tokens_.size());
  tr.mode = config_.mode;
  tr.backend = backend_->name();
  if (!prompt_reported_) {
    tr.prompt = prompt_tokens_;
    prompt_reported_ = true;
  }

  if (ds) {  // the device's candidates: the same list, order and numbers (device_sampling.h)
    for (size_t i = 0; i < ds->ids.size(); ++i) {
      const int32_t cid = ds->ids[i];
      tr.top.push_back({cid, display_text(tok.token_bytes(cid)), ds->p[i], ds->logits[i],
                        ds->logits[i]});
      if (cid == id) tr.sampled_rank = int(i);
    }
  }
  // Candidates by probability after temperature, of what the sampler saw.
  if (!ds && !have_softmax) softmax_with_temperature(seen, sampler_cfg_.temperature, softmax);
  const std::vector<float>& p = softmax;
  const int k = ds ? 0 : std::min<int>(config_.top_candidates, int(p.size()));
  // The k best by (probability, then lower id) in one pass over the vocabulary, kept sorted
  // in a short list: a token enters only if it beats the list's last.
  auto better = [&](int32_t a, int32_t b) {
    return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
  };
  std::vector<int32_t> order;
  order.reserve(size_t(k) + 1);
  for (int32_t i = 0; k > 0 && i < int32_t(p.size()); ++i) {
    if (int(order.size()) == k && !better(i, order.back())) continue;
    order.insert(std::upper_bound(order.begin(), order.end(), i, better), i);
    if (int(order.size()) > k) order.pop_back();
  }
  for (int i = 0; i < k; ++i) {
    const int32_t cid = order[size_t(i)];
    tr.top.push_back({cid, display_text(tok.token_bytes(cid)), p[size_t(cid)], seen[size_t(cid)],
                      logits_[size_t(cid)]});
    if (cid == id) tr.sampled_rank = i;
  }

  tr.n_layer = c.n_layer;
  tr.n_head = c.n_head;
  // A verification's attention rows are those of its last query, not this token's: left
  // out, as for a token emitted from the queue.
  const bool speculative = queued || !drafted.empty();
  tr.n_attn = speculative || !config_.attention_rows ? 0 : seq;
  if (tr.n_attn > 0) tr.attention = std::move(fo.attention);
  tr.kv_first_pos = pos0;
  tr.kv_written = speculative ? 1 : T;
  tr.drafted = drafted;
  tr.accepted = drafted.empty() ? -1 : accepted;
  tr.rolled_back = drafted.empty() ? 0 : int(drafted.size()) - accepted;
  tr.draft_flops = draft_flops;
  tr.k_norm = std::move(fo.k_norm);
  tr.v_norm = std::move(fo.v_norm);
  tr.k_err = std::move(fo.k_err);
  tr.v_err = std::move(fo.v_err);
  tr.tokens_processed = int(fo.kv_rows / uint64_t(c.n_layer));  // every chunk replayed
  tr.flops = fo.flops + draft_flops;
  tr.kv_rows = fo.kv_rows;
  flops_total_ += fo.flops + draft_flops;
  kv_rows_total_ += fo.kv_rows;
  tr.flops_total = flops_total_;
  tr.kv_rows_total = kv_rows_total_;
  tr.kv_layers.resize(size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    KvLayerState& ks = tr.kv_layers[size_t(l)];
    ks.window = kv_cfg.layers[size_t(l)].window;
    ks.sink = kv_cfg.layers[size_t(l)].sink;
    if (cache_) {
      ks.held = cache_->held_ranges(l);
      ks.bytes = cache_->layer_bytes(l);
    }
  }
  tr.kv_bytes = cache_ ? cache_->bytes_used() : 0;
  tr.kv_transient_bytes = scratch ? scratch->rows_bytes() : 0;
  scratch.reset();

  // Commit the token and check the stop conditions.
  tokens_.push_back(id);
  history_.push_back(id);
  tr.seq_len = int(tokens_.size());
  gen_bytes_ += tr.piece;
  tr.emitted = stream_.push(tr.piece);
  if (config_.stop_at_eos && (tok.is_eog(id) || (tok.is_control(id) && id != tok.bos_id()))) {
    stop_ = StopReason::Eos;
  } else if (std::find(config_.stop_ids.begin(), config_.stop_ids.end(), id) !=
             config_.stop_ids.end()) {
    stop_ = StopReason::StopToken;
  } else if (!config_.stop_strings.empty() &&
             std::any_of(config_.stop_strings.begin(), config_.stop_strings.end(),
                         [&](const std::string& s) {
                           return !s.empty() && gen_bytes_.find(s) != std::string::npos;
                         })) {
    stop_ = StopReason::StopString;
  } else if (generated() >= config_.max_tokens) {
    stop_ = StopReason::MaxTokens;
  } else if (config_.limits.on_full == ContextPolicy::Stop &&
             int(tokens_.size()) >= context_limit()) {
    stop_ = StopReason::ContextFull;
  }
  if (stop_ != StopReason::None) {
    tr.emitted += stream_.flush();
    queue_.clear();
  }
  tr.stop = stop_;
  tr.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  tr.device_ms = device_ms ? *device_ms : -1.0;
  return tr;
}

Status Session::replay(KvCache& cache, ForwardOutput& fo, int* pos0, int* T) {
  uint64_t flops = 0, kv_rows = 0;
  int h = 0;  // history tokens through the forward so far
  for (const ShiftEvent& e : shifts_) {
    if (e.at > h) {
      ForwardOutput part;
      KV_TRY(
          forward(*backend_, *model_, history_.data() + h, e.at - h, cache.length(), cache, part));
      flops += part.flops;
      kv_rows += part.kv_rows;
      h = e.at;
    }
    KV_TRY(kv_shift(*backend_, *model_, cache, e.first, e.n));
  }
  *pos0 = cache.length();
  *T = int(history_.size()) - h;
  KV_TRY(forward(*backend_, *model_, history_.data() + h, *T, *pos0, cache, fo));
  fo.flops += flops;
  fo.kv_rows += kv_rows;
  return Status::Ok();
}

std::string describe_kv_config(const SessionConfig& cfg, int model_ctx) {
  std::string s =
      "kv " + kv_types_name(cfg.kv_types) + ", " + kv_limits_name(cfg.limits, model_ctx);
  if (cfg.kv_policy == KvPolicy::Full) s += ", windowed layers keep every position";
  return s;
}

}  // namespace kvscope
