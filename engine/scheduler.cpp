// scheduler.cpp — continuous batching over the block pool (see scheduler.h).
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "engine/beam_search.h"
#include "engine/device_sampling.h"
#include "engine/forward.h"

namespace kvscope {

struct Scheduler::Seq {
  int id = 0;
  Request req;
  SeqState state = SeqState::Pending;
  std::vector<int32_t> tokens;  // prompt, then the generated tokens
  std::vector<int32_t> gen;
  std::unique_ptr<KvCache> cache;
  Sampler sampler;
  Utf8Stream stream;
  std::string text;
  StopReason stop = StopReason::None;
  std::vector<float> logits;
  std::vector<uint64_t> hashes;  // chain hashes of the full blocks of `tokens`
  int published = 0;             // leading blocks published to the prefix cache
  int cow_seen = 0;
  std::chrono::steady_clock::time_point arrived;
  bool first_token = false;
  int first_hit = -1;  // prefix-cache tokens at the first admission (-1: not admitted yet)
  int fork_of = -1;           // a sample waiting to be forked off this sequence
  std::vector<int> samples;   // the samples to fork off this one when its prompt is done
  // Speculation: the drafter (made at the first draft), the acceptance rule's generator,
  // and this step's draft: `verify` is the last token then the draft tokens.
  std::unique_ptr<Drafter> drafter;
  std::mt19937_64 spec_rng;
  std::vector<int32_t> draft;
  std::vector<std::vector<float>> draft_q;
  std::vector<int32_t> verify;
  // Beam search: the request's BeamSet (index into beam_sets_, -1: not a beam), whether
  // its logits are fresh and wait for the step's selection, and its summed log p.
  int beam = -1;
  bool ready = false;
  double logprob = 0;
};

struct Scheduler::BeamSet {
  int index = 0;  // in beam_sets_
  int root = 0;   // the request's first sequence
  int K = 1;
  float length_penalty = 1.0f;
  int max_tokens = 1;
  std::vector<int> live;  // its beams, best-ranked first
  std::vector<BeamHypothesis> hyps;
  bool started = false;  // admitted once: it holds K seats until done
  bool done = false;
};

uint64_t sample_seed(uint64_t seed, int k) {
  if (k == 0) return seed;
  uint64_t x = seed + 0x9E3779B97F4A7C15ull * uint64_t(k);  // splitmix64
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const char* seq_state_name(SeqState s) {
  switch (s) {
    case SeqState::Pending: return "pending";
    case SeqState::Waiting: return "waiting";
    case SeqState::Running: return "running";
    case SeqState::Finished: return "finished";
    case SeqState::Cancelled: return "cancelled";
    case SeqState::Failed: return "failed";
  }
  return "?";
}

const char* event_kind_name(EventKind k) {
  switch (k) {
    case EventKind::Arrive: return "arrive";
    case EventKind::Admit: return "admit";
    case EventKind::PrefixHit: return "prefix_hit";
    case EventKind::Chunk: return "chunk";
    case EventKind::Cow: return "cow";
    case EventKind::Preempt: return "preempt";
    case EventKind::Finish: return "finish";
    case EventKind::Cancel: return "cancel";
    case EventKind::Fail: return "fail";
    case EventKind::Fork: return "fork";
    case EventKind::Rollback: return "rollback";
  }
  return "?";
}

Expected<std::unique_ptr<Scheduler>> Scheduler::create(std::shared_ptr<const Model> model,
                                                       Backend& backend, SchedulerConfig cfg,
                                                       std::shared_ptr<const Model> draft,
                                                       std::unique_ptr<Backend> draft_backend) {
  if (!model) return make_error("scheduler: no model");
  if (!kv_block_size_ok(cfg.block_size))
    return make_error("scheduler: block size ", cfg.block_size, " (one of ",
                      kv_block_size_choices(), ")");
  if (cfg.max_batch_tokens < 1 || cfg.max_batch_tokens > kMaxBatchTokens)
    return make_error("scheduler: max batch tokens ", cfg.max_batch_tokens, " (1 to ",
                      kMaxBatchTokens, ")");
  if (cfg.max_seqs < 1) return make_error("scheduler: max seqs ", cfg.max_seqs, " (at least 1)");
  const SpeculativeConfig& sp = cfg.speculation;
  if (sp.kind != DraftKind::None && (sp.draft_max < 1 || sp.draft_max > 15))
    return make_error("scheduler: draft-max ", sp.draft_max, " is outside 1..15");
  if (sp.kind == DraftKind::Model) {
    if (!draft || !draft_backend)
      return make_error("scheduler: speculative draft: needs the draft model and a backend for it");
    KV_TRY(check_same_vocabulary(*model, *draft));
  }
  if (sp.kind == DraftKind::EarlyExit && (sp.layers < 1 || sp.layers >= model->config().n_layer))
    return make_error("speculative: early-exit:", sp.layers, " is outside 1..",
                      model->config().n_layer - 1, " (the model has ", model->config().n_layer,
                      " layers)");
  const int n_ctx = model->config().n_ctx;
  if (cfg.context <= 0 || (n_ctx > 0 && cfg.context > n_ctx)) cfg.context = n_ctx > 0 ? n_ctx : 4096;
  auto s = std::unique_ptr<Scheduler>(new Scheduler());
  s->model_ = std::move(model);
  s->backend_ = &backend;
  if (sp.kind == DraftKind::Model) {
    s->draft_model_ = std::move(draft);
    s->draft_backend_ = std::move(draft_backend);
  }
  // Slots are positions (no rings); windowed layers form their own groups, whose blocks
  // go back to the pool once outside the window (KvCache::drop_outside_windows).
  s->cache_cfg_ = kv_cache_config(*s->model_, cfg.kv_types, KvPolicy::Full);
  s->groups_ = kv_layer_groups(s->cache_cfg_);
  const ModelConfig& c = s->model_->config();
  KvPoolConfig pc{{s->groups_.size, c.n_head_kv, c.head_dim}, cfg.kv_types, cfg.block_size,
                  cfg.pool_blocks};
  if (pc.n_blocks <= 0) pc.n_blocks = s->groups_.count() * kv_blocks_for(cfg.context, cfg.block_size);
  cfg.pool_blocks = pc.n_blocks;
  auto pool = backend.create_kv_pool(pc);
  if (!pool.ok()) return pool.error();
  s->pool_ = std::move(*pool);
  // The prefix cache's salt: what besides the token ids decides a block's rows.
  uint64_t salt = 1469598103934665603ull;
  for (int l = 0; l < c.n_layer; ++l)
    salt = (salt ^ uint64_t(uint32_t(s->cache_cfg_.layers[size_t(l)].window))) * 1099511628211ull;
  salt = (salt ^ uint64_t(uint32_t(c.n_vocab))) * 1099511628211ull;
  s->salt_ = salt;
  s->cfg_ = cfg;
  return s;
}

Scheduler::~Scheduler() = default;

int Scheduler::size() const { return int(seqs_.size()); }

Expected<int> Scheduler::add(Request r) {
  const int V = model_->config().n_vocab;
  if (r.prompt.empty()) return make_error("request: the prompt has no tokens");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= V)
      return make_error("request: token ", i, " has id ", r.prompt[i],
                        ", outside the vocabulary [0, ", V, ")");
  if (int(r.prompt.size()) >= cfg_.context)
    return make_error("request: the prompt has ", r.prompt.size(),
                      " tokens but a sequence holds at most ", cfg_.context);
  if (r.max_tokens < 1) return make_error("request: max tokens ", r.max_tokens, " (at least 1)");
  if (r.n < 1 || r.n > 64 || r.n > cfg_.max_seqs)
    return make_error("request: ", r.n, " samples; 1 to ", std::min(64, cfg_.max_seqs),
                      " (at most --max-seqs run at once)");
  if (r.min_tokens < 0) return make_error("request: min tokens ", r.min_tokens, " is negative");
  if (r.logprobs < -1 || r.logprobs > 20)
    return make_error("request: logprobs ", r.logprobs, " (-1 for none, else 0 to 20)");
  KV_TRY(penalty_config_check(r.sampler.penalties, model_->config().n_vocab));
  if (r.beams != 0) {
    if (r.beams < 1 || r.beams > 64 || r.beams > cfg_.max_seqs)
      return make_error("request: ", r.beams, " beams; 1 to ", std::min(64, cfg_.max_seqs),
                        " (at most --max-seqs run at once)");
    if (r.n != 1) return make_error("request: beam search draws no samples (n must be 1)");
    if (r.logprobs >= 0) return make_error("request: beam search gives no logprobs");
    if (r.sampler.penalties.active() || r.min_tokens > 0 || !r.stop_ids.empty())
      return make_error("request: beam search scores the model's own log-probabilities: no "
                        "penalties, minimum length or stop token ids");
    if (!std::isfinite(r.length_penalty) || std::fabs(r.length_penalty) > 10)
      return make_error("request: length penalty ", r.length_penalty, " is outside -10..10");
    if (int64_t(r.prompt.size()) + r.max_tokens > cfg_.context)
      return make_error("request: the prompt (", r.prompt.size(), " tokens) and ", r.max_tokens,
                        " beam tokens need more than the ", cfg_.context, " positions a sequence holds");
  }
  for (int32_t id : r.stop_ids)
    if (id < 0 || id >= model_->config().n_vocab)
      return make_error("request: stop token id ", id, " is outside the vocabulary");
  const int most = std::min<int64_t>(int64_t(r.prompt.size()) + r.max_tokens, cfg_.context);
  // The most blocks the sequence holds at once: every block in a full group; a windowed
  // group's window and one step's tokens.
  int need = 0;
  for (int g = 0; g < groups_.count(); ++g) {
    const int W = groups_.window[size_t(g)];
    need += W == 0 ? kv_blocks_for(most, cfg_.block_size)
                   : std::min(kv_blocks_for(most, cfg_.block_size),
                              kv_blocks_for(W - 1 + cfg_.max_batch_tokens, cfg_.block_size) + 1 +
                                  kv_blocks_for(groups_.sink[size_t(g)], cfg_.block_size));
  }
  if (r.beams > 1) need *= r.beams;  // every beam's own copy, at worst
  if (need > pool_->n_blocks())
    return make_error("request: ", most, " positions", r.beams > 1 ? " in each beam" : "",
                      " need ", need, " blocks of ", cfg_.block_size,
                      " positions but the pool has ", pool_->n_blocks());
  const int first = int(seqs_.size());
  std::vector<std::unique_ptr<Seq>> made;
  for (int k = 0; k < r.n; ++k) {
    auto s = std::make_unique<Seq>();
    s->id = first + k;
    s->tokens = r.prompt;
    s->req = r;
    s->req.n = 1;
    s->req.sampler.seed = sample_seed(r.sampler.seed, k);
    s->sampler.configure(s->req.sampler);
    s->spec_rng.seed(s->req.sampler.seed ^ kSpeculationSeed);
    if (k > 0) {
      s->fork_of = first;
      made[0]->samples.push_back(s->id);
    }
    auto cache = backend_->create_paged_kv_cache(cache_cfg_, pool_);
    if (!cache.ok()) return cache.error();
    s->cache = std::move(*cache);
    made.push_back(std::move(s));
  }
  if (r.beams > 0) {
    auto set = std::make_unique<BeamSet>();
    set->index = int(beam_sets_.size());
    set->root = first;
    set->K = r.beams;
    set->length_penalty = r.length_penalty;
    set->max_tokens = r.max_tokens;
    set->live = {first};
    made[0]->beam = int(beam_sets_.size());
    open_beams_.push_back(made[0]->beam);
    beam_sets_.push_back(std::move(set));
  }
  for (auto& s : made) seqs_.push_back(std::move(s));
  return first;
}

Status Scheduler::cancel(int id) {
  if (id < 0 || id >= int(seqs_.size())) return make_error("cancel: no request ", id);
  if (!seqs_[size_t(id)])
    return make_error("cancel: request ", id, " is already ", seq_state_name(state(id)));
  Seq& s = *seqs_[size_t(id)];
  if (s.state != SeqState::Pending && s.state != SeqState::Waiting &&
      s.state != SeqState::Running)
    return make_error("cancel: request ", id, " is already ", seq_state_name(s.state));
  if (s.beam >= 0) {  // a beam search is cancelled whole
    BeamSet& set = *beam_sets_[size_t(s.beam)];
    for (int b : set.live) {
      Seq& x = *seqs_[size_t(b)];
      x.cache->release();
      std::erase(waiting_, b);
      std::erase(running_, b);
      x.state = SeqState::Cancelled;
      x.ready = false;
    }
    set.live.clear();
    set.done = true;
    std::erase(open_beams_, s.beam);
    return Status::Ok();
  }
  s.cache->release();
  s.drafter.reset();
  std::erase(waiting_, id);
  std::erase(running_, id);
  s.state = SeqState::Cancelled;
  // A sample not forked yet leaves its request's list of samples to fork.
  if (s.fork_of >= 0 && seqs_[size_t(s.fork_of)])
    std::erase(seqs_[size_t(s.fork_of)]->samples, id);
  s.fork_of = -1;
  // Samples not forked yet go with it.
  for (int c : s.samples) {
    seqs_[size_t(c)]->state = SeqState::Cancelled;
    seqs_[size_t(c)]->fork_of = -1;
  }
  s.samples.clear();
  return Status::Ok();
}

Status Scheduler::forget(int id) {
  if (id < 0 || id >= int(seqs_.size())) return make_error("forget: no request ", id);
  if (!seqs_[size_t(id)]) return Status::Ok();
  Seq& s = *seqs_[size_t(id)];
  if (s.state != SeqState::Finished && s.state != SeqState::Cancelled &&
      s.state != SeqState::Failed)
    return make_error("forget: request ", id, " is still ", seq_state_name(s.state));
  if (gone_.size() < seqs_.size()) gone_.resize(seqs_.size());
  gone_[size_t(id)] = {s.state, s.stop};
  s.cache->release();
  // A finished search's hypotheses go with its first sequence.
  if (s.beam >= 0 && beam_sets_[size_t(s.beam)] && beam_sets_[size_t(s.beam)]->root == id &&
      beam_sets_[size_t(s.beam)]->done)
    beam_sets_[size_t(s.beam)].reset();
  seqs_[size_t(id)].reset();
  return Status::Ok();
}

bool Scheduler::idle() const {
  for (const auto& s : seqs_)
    if (s && (s->state == SeqState::Pending || s->state == SeqState::Waiting ||
              s->state == SeqState::Running))
      return false;
  return true;
}

SeqState Scheduler::state(int id) const {
  const auto& s = seqs_.at(size_t(id));
  return s ? s->state : gone_.at(size_t(id)).state;
}
StopReason Scheduler::stop_reason(int id) const {
  const auto& s = seqs_.at(size_t(id));
  return s ? s->stop : gone_.at(size_t(id)).stop;
}
const std::vector<int32_t>& Scheduler::generated(int id) const {
  static const std::vector<int32_t> none;
  const auto& s = seqs_.at(size_t(id));
  return s ? s->gen : none;
}
std::string Scheduler::text(int id) const {
  const auto& s = seqs_.at(size_t(id));
  return s ? s->text : std::string();
}
const std::vector<float>& Scheduler::last_logits(int id) const {
  static const std::vector<float> none;
  const auto& s = seqs_.at(size_t(id));
  return s ? s->logits : none;
}

Status Scheduler::check() const {
  std::vector<const std::vector<int32_t>*> tables;
  for (const auto& s : seqs_)
    if (s)
      for (int g = 0; g < s->cache->n_groups(); ++g) tables.push_back(&s->cache->blocks(g));
  return pool_->check(tables);
}

Expected<BatchStep> Scheduler::step() {
  BatchStep out;
  const auto t0 = std::chrono::steady_clock::now();
  step_start_ = t0;
  Status st = run_step(out);
  if (!st.ok()) return st.error();
  out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  stats_.ms += out.ms;
  return out;
}

void Scheduler::preempt(Seq& s, BatchStep& out) {
  // Blocks already published stay in the prefix cache: the recompute often finds them.
  out.events.push_back({EventKind::Preempt, s.id, int(s.tokens.size()), {}});
  s.cache->release();
  s.published = 0;
  s.cow_seen = s.cache->cow_copies();
  s.state = SeqState::Waiting;
  s.ready = false;  // a beam computes its logits again
  std::erase(running_, s.id);
  waiting_.insert(waiting_.begin(), s.id);
  ++stats_.preemptions;
}

void Scheduler::finish(Seq& s, StopReason r, BatchStep& out) {
  s.stop = r;
  const std::string tail = s.stream.flush();  // an unfinished character, as U+FFFD
  s.text += tail;
  const auto row = std::find_if(out.rows.rbegin(), out.rows.rend(),
                                [&](const StepRow& r) { return r.seq == s.id; });
  if (row != out.rows.rend()) row->text += tail;
  s.state = SeqState::Finished;
  s.cache->release();
  s.drafter.reset();
  std::erase(running_, s.id);
  out.events.push_back({EventKind::Finish, s.id, int(s.gen.size()), stop_reason_name(r)});
  ++stats_.finished;
}

// Group g's block i is published under the token chain's hash of block i, salted with g.
uint64_t Scheduler::group_hash(uint64_t chain, int g) const {
  return g == 0 ? chain : pool_->chain_hash(chain, nullptr, 0, salt_ + uint64_t(g));
}

void Scheduler::publish_full_blocks(Seq& s) {
  if (!cfg_.prefix_caching) return;
  const int B = cfg_.block_size;
  const int full = s.cache->length() / B;
  while (int(s.hashes.size()) < full) {
    const size_t i = s.hashes.size();
    const uint64_t parent = i == 0 ? 0 : s.hashes[i - 1];
    s.hashes.push_back(pool_->chain_hash(parent, s.tokens.data() + i * size_t(B), B, salt_));
  }
  for (; s.published < full; ++s.published)
    for (int g = 0; g < s.cache->n_groups(); ++g) {
      const int32_t b = s.cache->blocks(g)[size_t(s.published)];
      if (b >= 0) pool_->publish(b, group_hash(s.hashes[size_t(s.published)], g));
    }
}

void Scheduler::record_pool(BatchStep& out) {
  const int B = cfg_.block_size;
  PoolState& p = out.pool;
  p.counts = pool_->counts();
  p.block_size = B;
  // Positions each used block holds: the most any table that points to it fills.
  std::vector<int> filled(size_t(pool_->n_blocks()), 0);
  uint64_t last_empty = 0, held_by_seqs = 0, table_blocks = 0;
  const int G = groups_.count();
  for (int id : running_) {
    const Seq& s = *seqs_[size_t(id)];
    const int len = s.cache->length();
    held_by_seqs += uint64_t(len) * uint64_t(G);
    table_blocks += uint64_t(s.cache->held_blocks());
    for (int g = 0; g < G; ++g) {
      const auto& t = s.cache->blocks(g);
      for (size_t i = 0; i < t.size(); ++i) {
        if (t[i] < 0) continue;
        const int in_block = std::clamp(len - int(i) * B, 0, B);
        filled[size_t(t[i])] = std::max(filled[size_t(t[i])], in_block);
      }
      if (!t.empty() && t.back() >= 0) last_empty += uint64_t(int(t.size()) * B - len);
    }
  }
  for (int f : filled) p.held_positions += f;
  p.allocated_slots = p.counts.used * B;
  held_sum_ += uint64_t(p.held_positions);
  alloc_sum_ += uint64_t(p.allocated_slots);
  last_empty_sum_ += last_empty;
  contiguous_sum_ += uint64_t(running_.size()) * uint64_t(cfg_.context) * uint64_t(G);
  contiguous_held_sum_ += held_by_seqs;
  const KvPoolConfig& pc = pool_->config();
  const uint64_t per_pos = kv_block_bytes(pc) / uint64_t(B) * uint64_t(G);  // all layers
  stats_.peak_kv_bytes =
      std::max(stats_.peak_kv_bytes, uint64_t(p.counts.used) * kv_block_bytes(pc));
  stats_.unshared_kv_bytes = std::max(stats_.unshared_kv_bytes, table_blocks * kv_block_bytes(pc));
  stats_.contiguous_kv_bytes = std::max(
      stats_.contiguous_kv_bytes, uint64_t(running_.size()) * uint64_t(cfg_.context) * per_pos);
  stats_.slot_utilization = alloc_sum_ ? double(held_sum_) / double(alloc_sum_) : 0;
  stats_.internal_fragmentation = alloc_sum_ ? double(last_empty_sum_) / double(alloc_sum_) : 0;
  stats_.contiguous_utilization =
      contiguous_sum_ ? double(contiguous_held_sum_) / double(contiguous_sum_) : 0;
}

Status Scheduler::adopt_prefix(Seq& s, int* hit) {
  const int B = cfg_.block_size, G = groups_.count();
  // Full blocks of the tokens, all but the last token (whose logits are needed).
  const int full = (int(s.tokens.size()) - 1) / B;
  s.hashes.clear();
  uint64_t parent = 0;
  for (int i = 0; i < full; ++i) {
    parent = pool_->chain_hash(parent, s.tokens.data() + size_t(i) * B, B, salt_);
    s.hashes.push_back(parent);
  }
  // The longest h such that every block a query at h * B sees is cached in every group
  // (a windowed group needs only its window's blocks and its sinks).
  const auto needed = [&](int g, int i, int h) {
    const int W = groups_.window[size_t(g)];
    return W == 0 || (i + 1) * B > h * B - W + 1 || i * B < groups_.sink[size_t(g)];
  };
  // Start from the leading hits of a full group (every block needed), else from all.
  const auto g_full = std::find(groups_.window.begin(), groups_.window.end(), 0);
  int h = full;
  if (g_full != groups_.window.end()) {
    const int g = int(g_full - groups_.window.begin());
    h = 0;
    while (h < full && pool_->find(group_hash(s.hashes[size_t(h)], g)) >= 0) ++h;
  }
  for (; h > 0; --h) {
    bool all = true;
    for (int g = 0; g < G && all; ++g)
      for (int i = 0; i < h && all; ++i)
        if (needed(g, i, h) && pool_->find(group_hash(s.hashes[size_t(i)], g)) < 0) all = false;
    if (all) break;
  }
  s.hashes.resize(size_t(h));
  s.published = h;
  *hit = 0;
  if (h == 0) return Status::Ok();
  std::vector<std::vector<int32_t>> tables(size_t(G), std::vector<int32_t>(size_t(h), -1));
  for (int g = 0; g < G; ++g)
    for (int i = 0; i < h; ++i)
      if (needed(g, i, h)) tables[size_t(g)][size_t(i)] = pool_->lookup(group_hash(s.hashes[size_t(i)], g));
  Status st = s.cache->adopt_groups(tables, h * B);
  for (const auto& t : tables)  // adopt() took its own references
    for (int32_t b : t)
      if (b >= 0) pool_->unref(b);
  KV_TRY(st);
  *hit = h * B;
  return Status::Ok();
}

int Scheduler::blocks_needed(const Seq& s, int n) const {
  const int B = cfg_.block_size;
  const int len = s.cache->length();
  int need = 0;
  for (int g = 0; g < s.cache->n_groups(); ++g) {
    const auto& t = s.cache->blocks(g);
    need += std::max(0, kv_blocks_for(len + n, B) - int(t.size()));
    if (len % B != 0 && len / B < int(t.size())) {
      const int last = t[size_t(len / B)];
      if (last >= 0 && (pool_->ref_count(last) > 1 || pool_->published(last))) ++need;
    }
  }
  return need;
}

Status Scheduler::plan_drafts(std::vector<Planned>& plan, int& budget, int& reserved) {
  const SpeculativeConfig& sp = cfg_.speculation;
  for (Planned& p : plan) {
    Seq& s = *p.s;
    s.draft.clear();
    s.draft_q.clear();
    if (budget <= 0) break;
    // A decode row: one token, the last sampled one, after a computed prompt.
    if (p.n != 1 || s.gen.empty() || s.cache->length() + 1 != int(s.tokens.size()) ||
        s.req.logprobs >= 0 || s.beam >= 0)
      continue;
    const int seq = int(s.tokens.size());
    const int room = std::min({sp.draft_max, cfg_.context - seq - 1,
                               s.req.max_tokens - int(s.gen.size()) - 1, budget});
    if (room <= 0) continue;
    if (!s.drafter) {
      if (sp.kind == DraftKind::Ngram) {
        s.drafter = make_ngram_drafter();
      } else {
        // Its cache holds what the sequence can reach: the prompt and max_tokens.
        const int most = int(std::min<int64_t>(
            cfg_.context, int64_t(s.req.prompt.size()) + int64_t(s.req.max_tokens)));
        auto made = sp.kind == DraftKind::Model
                        ? make_model_drafter(draft_model_, draft_backend_.get(), 0, cfg_.kv_types, most)
                        : make_model_drafter(model_, backend_, sp.layers, cfg_.kv_types, most);
        if (!made.ok()) return made.error();
        s.drafter = std::move(*made);
      }
    }
    KV_TRY(s.drafter->propose(s.tokens, room, s.req.sampler, s.spec_rng, s.draft, s.draft_q));
    int k = std::min(int(s.draft.size()), room);
    // Only free blocks (a cached block is never evicted for a draft).
    const int base = blocks_needed(s, 1);
    while (k > 0 && blocks_needed(s, 1 + k) - base > pool_->counts().free - reserved) --k;
    s.draft.resize(size_t(k));
    s.draft_q.resize(size_t(k));
    if (k == 0) continue;
    reserved += blocks_needed(s, 1 + k) - base;
    budget -= k;
    p.n = 1 + k;
    s.verify.assign(1, s.tokens.back());
    s.verify.insert(s.verify.end(), s.draft.begin(), s.draft.end());
  }
  return Status::Ok();
}

Status Scheduler::run_step(BatchStep& out) {
  const int B = cfg_.block_size;
  out.step = ++step_;
  ++stats_.steps;
  for (auto& sp : seqs_)
    if (sp && sp->state == SeqState::Pending && sp->fork_of < 0 && sp->req.arrival_step <= step_) {
      sp->state = SeqState::Waiting;
      waiting_.push_back(sp->id);
      out.events.push_back({EventKind::Arrive, sp->id, int(sp->tokens.size()), {}});
      sp->arrived = step_start_;
    }
  int budget = cfg_.max_batch_tokens;
  std::vector<Planned> plan;
  // 1. Running sequences, oldest first. Blocks are reserved as the plan grows: `reserved`
  // counts those promised to sequences planned before.
  int reserved = 0;
  bool preempted = false;
  const std::vector<int> running = running_;
  for (int id : running) {
    Seq& s = *seqs_[size_t(id)];
    if (s.state != SeqState::Running) continue;  // preempted below for an older one
    int n = std::min(int(s.tokens.size()) - s.cache->length(), budget);
    if (n <= 0) continue;
    // A prompt chunk the pool cannot hold whole shrinks to what it can (at least one
    // token) before anyone is preempted for it.
    while (n > 1 && blocks_needed(s, n) > pool_->available() - reserved) --n;
    const int need = blocks_needed(s, n);
    bool fits = true;
    while (pool_->available() - reserved < need) {
      // Preempt the newest running sequence; if that is this one, it waits.
      Seq& victim = *seqs_[size_t(running_.back())];
      preempt(victim, out);
      preempted = true;
      if (&victim == &s) {
        fits = false;
        break;
      }
    }
    if (!fits) continue;
    if (n < int(s.tokens.size()) - s.cache->length())
      out.events.push_back({EventKind::Chunk, s.id, n, {}});
    reserved += need;
    plan.push_back({&s, n});
    budget -= n;
  }
  // 2. Waiting requests, first come first served; none in a step that had to preempt
  // (the pool is short: a preempted sequence would be taken back at once).
  while (!preempted && !waiting_.empty() && budget > 0) {
    Seq& s = *seqs_[size_t(waiting_.front())];
    // A request of n samples is admitted only when all n can run, a beam search only when
    // its K beams can (a beam that waits again has its seat already).
    int seats = 1 + int(s.samples.size());
    if (s.beam >= 0) seats = beam_sets_[size_t(s.beam)]->started ? 0 : beam_sets_[size_t(s.beam)]->K;
    if (seats_held() + seats > cfg_.max_seqs) break;
    int hit = 0;
    if (cfg_.prefix_caching && s.cache->length() == 0) {
      KV_TRY(adopt_prefix(s, &hit));
    }
    const int left = int(s.tokens.size()) - s.cache->length();
    int n = std::min(left, budget);
    // What the pool can give beyond the blocks promised this step.
    const int spare = pool_->available() - reserved;
    const int len = s.cache->length(), table = int(s.cache->blocks().size());
    const int G = s.cache->n_groups();
    // Shared or published last blocks are copied before the first write: blocks less.
    const int copies = blocks_needed(s, 1) - G * (kv_blocks_for(len + 1, B) - table);
    const int room = ((spare - copies) / G + table) * B - len;
    if (blocks_needed(s, n) > spare) n = std::min(n, room);
    if (n <= 0 || blocks_needed(s, n) > spare) {
      s.cache->release();  // the blocks it found stay cached for later
      break;
    }
    waiting_.erase(waiting_.begin());
    running_.push_back(s.id);
    s.state = SeqState::Running;
    s.cow_seen = s.cache->cow_copies();
    if (s.beam >= 0) beam_sets_[size_t(s.beam)]->started = true;
    out.events.push_back({EventKind::Admit, s.id, int(s.tokens.size()), {}});
    if (hit > 0) {
      out.events.push_back({EventKind::PrefixHit, s.id, hit, {}});
      stats_.prefix_hit_tokens += uint64_t(hit);
    }
    if (s.first_hit < 0) s.first_hit = hit;
    if (n < left) out.events.push_back({EventKind::Chunk, s.id, n, {}});
    reserved += blocks_needed(s, n);
    plan.push_back({&s, n});
    budget -= n;
  }
  // 3. Drafts, with what is left.
  if (cfg_.speculation.kind != DraftKind::None) KV_TRY(plan_drafts(plan, budget, reserved));
  out.running = int(running_.size());
  out.waiting = int(waiting_.size());
  if (plan.empty()) {
    if (!open_beams_.empty()) KV_TRY(select_beams(out));
    record_pool(out);
    return Status::Ok();
  }
  // One-token rows first: their LM heads run as one product.
  std::stable_partition(plan.begin(), plan.end(), [](const Planned& p) { return p.n == 1; });
  std::vector<BatchSeq> batch;
  for (const Planned& p : plan) {
    const int len = p.s->cache->length();
    BatchSeq b;
    b.cache = p.s->cache.get();
    b.T = p.n;
    if (!p.s->draft.empty()) {  // verify: every row's logits
      b.tokens = p.s->verify.data();
      b.logits = false;
      b.all_logits = true;
    } else {
      b.tokens = p.s->tokens.data() + len;
      b.logits = len + p.n == int(p.s->tokens.size());
      b.attention = cfg_.attention && b.logits;
      b.logits_on_device = b.logits && device_sample_n(*p.s) > 0;
    }
    batch.push_back(b);
    out.batch_tokens += p.n;
  }
  std::vector<BatchSeqOutput> fo;
  KV_TRY(forward_batch(*backend_, *model_, batch, fo));
  std::vector<int32_t> dev_token;
  KV_TRY(sample_on_device(plan, fo, dev_token));
  std::vector<int32_t> drawn;
  draw_tokens(plan, batch, fo, dev_token, drawn);
  for (size_t i = 0; i < plan.size(); ++i) {
    Seq& s = *plan[i].s;
    StepRow row;
    row.seq = s.id;
    row.tokens = plan[i].n;
    row.pos0 = s.cache->length() - plan[i].n;
    const bool verify = !s.draft.empty();
    row.is_prompt = !verify && (plan[i].n > 1 || row.pos0 + 1 < int(s.tokens.size()));
    if (s.cache->cow_copies() > s.cow_seen) {
      out.events.push_back({EventKind::Cow, s.id, s.cache->cow_copies() - s.cow_seen, {}});
      stats_.cow_copies += s.cache->cow_copies() - s.cow_seen;
      s.cow_seen = s.cache->cow_copies();
    }
    if (row.is_prompt) stats_.prefill_tokens += uint64_t(plan[i].n);
    StopReason verified_stop = StopReason::None;
    if (verify) {  // rolled back before any block is published
      auto r = accept_draft(s, fo[i].logits, row, out);
      if (!r.ok()) return r.error();
      verified_stop = *r;
    }
    publish_full_blocks(s);
    auto dropped = s.cache->drop_outside_windows();  // published ones stay cached
    if (!dropped.ok()) return dropped.error();
    if (batch[i].logits && !verify) {
      s.logits = std::move(fo[i].logits);
      row.attention = std::move(fo[i].attention);
      if (s.beam >= 0) {
        s.ready = true;  // its token comes from its request's selection, after the forward
      } else {
        // A request's samples fork off now: the same prompt blocks, the same logits.
        if (!s.samples.empty()) KV_TRY(fork_samples(s, out));
        if (dev_token[i] >= 0)
          emit(s, dev_token[i], row);  // settled by the device's candidates
        else if (drawn[i] >= 0)
          emit(s, drawn[i], row);  // drawn with the others (draw_tokens)
        else
          sample_next(s, row);
        note_first_token(s);
      }
    }
    record_tables(s, row);
    if (!row.is_prompt && row.token_id >= 0) {
      ++stats_.decode_rows;
      stats_.decode_row_tokens += row.tokens_out.size();
    }
    out.rows.push_back(std::move(row));
    if (verify) {
      if (verified_stop != StopReason::None) finish(s, verified_stop, out);
      continue;
    }
    if (!batch[i].logits || s.beam >= 0) continue;
    check_stop(s, out);
  }
  if (!open_beams_.empty()) KV_TRY(select_beams(out));
  out.running = int(running_.size());
  out.waiting = int(waiting_.size());
  record_pool(out);
  return Status::Ok();
}

namespace {

// The log-softmax of `logits` at token t, and the k largest (most likely first, ties:
// lower id) into row.
void token_logprobs(const std::vector<float>& logits, int32_t t, int k, StepRow& row) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - double(mx));
  const double lse = double(mx) + std::log(sum);
  row.logprob = float(double(logits[size_t(t)]) - lse);
  row.top_logprobs.clear();
  if (k <= 0) return;
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  const size_t n = std::min(ids.size(), size_t(k));
  std::partial_sort(ids.begin(), ids.begin() + long(n), ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] ||
           (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (size_t i = 0; i < n; ++i)
    row.top_logprobs.push_back({ids[i], float(double(logits[size_t(ids[i])]) - lse)});
}

}  // namespace

int Scheduler::device_sample_n(const Seq& s) const {
  // As the session decides (session.cpp): no logit shaping (penalties, held-back end and
  // stop ids), nothing that needs the whole row on the host (log-probabilities, a beam's
  // selection, samples forked with these logits).
  if (!cfg_.device_sampling || !backend_->can_sample_on_device() || s.beam >= 0 ||
      !s.samples.empty() || s.req.logprobs >= 0 || s.req.sampler.penalties.active() ||
      int(s.gen.size()) < s.req.min_tokens)
    return 0;
  return device_sample_candidates_needed(s.req.sampler, 0, model_->config().n_vocab);
}

Status Scheduler::sample_on_device(const std::vector<Planned>& plan,
                                   std::vector<BatchSeqOutput>& fo, std::vector<int32_t>& token) {
  const int V = model_->config().n_vocab;
  token.assign(plan.size(), -1);
  const auto temp = [&](size_t i) {
    const float t = plan[i].s->req.sampler.temperature;
    return t > 0 ? t : 1.0f;  // the CPU's softmax uses 1 for greedy
  };
  std::vector<DeviceCandidates> dc;
  for (size_t i = 0; i < plan.size();) {
    if (!fo[i].logits_dev.data) {
      ++i;
      continue;
    }
    // Consecutive rows of the logits (the step's one-token sequences share one LM-head
    // product) at one temperature: one pass over all of them, with the most candidates
    // any of them needs (more only lengthen what the host can verify).
    size_t j = i + 1;
    int n = device_sample_n(*plan[i].s);
    while (j < plan.size() && fo[j].logits_dev.data == fo[j - 1].logits_dev.data + V &&
           temp(j) == temp(i)) {
      n = std::max(n, device_sample_n(*plan[j].s));
      ++j;
    }
    const Tensor rows{fo[i].logits_dev.data, int64_t(j - i), V};
    KV_TRY(backend_->sample_candidates_rows(rows, n, temp(i), dc));
    for (size_t r = i; r < j; ++r) {
      Seq& s = *plan[r].s;
      const auto ds = device_sample_resolve(dc[r - i], V, s.req.sampler, 0);
      ++stats_.device_sampled;
      if (ds) {
        token[r] =
            s.req.sampler.temperature <= 0 ? ds->kept[0] : s.sampler.draw(ds->kept, ds->p_kept);
      } else {  // the candidates cannot settle it: the row comes back, the CPU path runs
        ++stats_.device_fallbacks;
        fo[r].logits.resize(size_t(V));
        KV_TRY(backend_->download(fo[r].logits_dev, fo[r].logits.data()));
      }
    }
    i = j;
  }
  return Status::Ok();
}

bool Scheduler::holds_back(const Seq& s) const {
  return int(s.gen.size()) < s.req.min_tokens;
}

int32_t Scheduler::draw_token(Seq& s, const std::vector<float>& logits,
                              std::vector<float>& shaped) const {
  const bool hold_back = holds_back(s);
  if (!s.req.sampler.penalties.active() && !hold_back) return s.sampler.sample(logits);
  std::vector<int32_t> held;
  if (hold_back) {
    held = end_ids_;
    held.insert(held.end(), s.req.stop_ids.begin(), s.req.stop_ids.end());
  }
  shaped = logits;
  shape_logits(s.req.sampler.penalties, s.tokens.data(), s.tokens.size(), held, shaped);
  return s.sampler.sample(shaped);
}

void Scheduler::sample_next(Seq& s, StepRow& row) {
  if (holds_back(s) && end_ids_.empty()) end_ids_ = generation_end_ids(model_->tokenizer());
  const int32_t t = draw_token(s, s.logits, shaped_);
  if (s.req.logprobs >= 0) {
    const bool shaped = s.req.sampler.penalties.active() || holds_back(s);
    token_logprobs(shaped ? shaped_ : s.logits, t, s.req.logprobs, row);
  }
  emit(s, t, row);
}

void Scheduler::draw_tokens(const std::vector<Planned>& plan, const std::vector<BatchSeq>& batch,
                            const std::vector<BatchSeqOutput>& fo,
                            const std::vector<int32_t>& dev_token, std::vector<int32_t>& token) {
  token.assign(plan.size(), -1);
  // The rows the step's loop would sample with sample_next: a sequence's own next token
  // (no draft verified, no beam, no samples forking off, no log-probabilities) at a
  // temperature (greedy's argmax is quick).
  std::vector<size_t> rows;
  for (size_t i = 0; i < plan.size(); ++i) {
    const Seq& s = *plan[i].s;
    if (batch[i].logits && s.draft.empty() && s.beam < 0 && s.samples.empty() &&
        s.req.logprobs < 0 && s.req.sampler.temperature > 0 && dev_token[i] < 0 &&
        !fo[i].logits.empty())
      rows.push_back(i);
  }
  if (rows.size() < 2) return;  // sample_next draws it
  for (size_t i : rows)
    if (holds_back(*plan[i].s) && end_ids_.empty())
      end_ids_ = generation_end_ids(model_->tokenizer());
  backend_->host_parallel(int64_t(rows.size()), [&](int64_t b, int64_t e) {
    std::vector<float> shaped;
    for (int64_t j = b; j < e; ++j) {
      const size_t i = rows[size_t(j)];
      token[i] = draw_token(*plan[i].s, fo[i].logits, shaped);
    }
  });
}

void Scheduler::emit(Seq& s, int32_t t, StepRow& row) {
  s.tokens.push_back(t);
  s.gen.push_back(t);
  row.tokens_out.push_back(t);
  row.token_id = t;
  row.pos = int(s.tokens.size()) - 1;
  const std::string piece = s.stream.push(model_->tokenizer().token_bytes(t));
  row.text += piece;
  s.text += piece;
  ++stats_.decode_tokens;
}

Expected<StopReason> Scheduler::accept_draft(Seq& s, std::vector<float>& logits, StepRow& row,
                                             BatchStep& out) {
  const int V = model_->config().n_vocab;
  const int k = int(s.draft.size());
  const int pos0 = row.pos0;
  const SamplerConfig& sc = s.req.sampler;
  // Row i follows the first i draft tokens: its logits shaped as sample_next would shape
  // them had those tokens been sampled.
  std::vector<std::vector<float>> raw(size_t(k) + 1), p(size_t(k) + 1);
  std::vector<int32_t> held, hist;
  for (int i = 0; i <= k; ++i) {
    raw[size_t(i)].assign(logits.begin() + int64_t(i) * V, logits.begin() + int64_t(i + 1) * V);
    const bool hold_back = int(s.gen.size()) + i < s.req.min_tokens;
    if (sc.penalties.active() || hold_back) {
      if (hold_back && end_ids_.empty()) end_ids_ = generation_end_ids(model_->tokenizer());
      held.clear();
      if (hold_back) {
        held = end_ids_;
        held.insert(held.end(), s.req.stop_ids.begin(), s.req.stop_ids.end());
      }
      hist = s.tokens;
      hist.insert(hist.end(), s.draft.begin(), s.draft.begin() + i);
      shaped_ = raw[size_t(i)];
      shape_logits(sc.penalties, hist.data(), hist.size(), held, shaped_);
      p[size_t(i)] = sampling_distribution(shaped_, sc);
    } else {
      p[size_t(i)] = sampling_distribution(raw[size_t(i)], sc);
    }
  }
  const Verdict v = speculative_accept(s.draft, s.draft_q, p, sc.temperature <= 0, s.spec_rng);
  // Roll back: the cache keeps the last token and the accepted rows.
  KV_TRY(s.cache->truncate(pos0 + 1 + v.accepted));
  row.drafted = s.draft;
  row.accepted = v.accepted;
  stats_.drafted += uint64_t(k);
  stats_.accepted += uint64_t(v.accepted);
  ++stats_.verify_rows;
  if (v.accepted < k) out.events.push_back({EventKind::Rollback, s.id, k - v.accepted, {}});
  // Emit the kept tokens and the one after them, each checked as a plain step would.
  StopReason stop = StopReason::None;
  for (int i = 0; i <= v.accepted && stop == StopReason::None; ++i) {
    s.logits = std::move(raw[size_t(i)]);
    emit(s, i < v.accepted ? s.draft[size_t(i)] : v.next, row);
    stop = stop_for(s);
  }
  s.draft.clear();
  s.draft_q.clear();
  return stop;
}

StopReason Scheduler::stop_for(const Seq& s) const {
  const Tokenizer& tok = model_->tokenizer();
  const int32_t t = s.gen.back();
  // Session's rule: an end-of-generation token, or any other control token but BOS.
  if (cfg_.stop_at_eos && (tok.is_eog(t) || (tok.is_control(t) && t != tok.bos_id())))
    return StopReason::Eos;
  if (std::find(s.req.stop_ids.begin(), s.req.stop_ids.end(), t) != s.req.stop_ids.end())
    return StopReason::StopToken;
  if (int(s.gen.size()) >= s.req.max_tokens) return StopReason::MaxTokens;
  if (int(s.tokens.size()) >= cfg_.context) return StopReason::ContextFull;
  return StopReason::None;
}

void Scheduler::check_stop(Seq& s, BatchStep& out) {
  const StopReason r = stop_for(s);
  if (r != StopReason::None) finish(s, r, out);
}

void Scheduler::record_tables(const Seq& s, StepRow& row) const {
  row.table = s.cache->blocks();
  row.tables.clear();
  for (int g = 1; g < s.cache->n_groups(); ++g) {
    if (row.tables.empty()) row.tables.push_back(row.table);
    row.tables.push_back(s.cache->blocks(g));
  }
  row.blocks = s.cache->held_blocks();
}

Status Scheduler::fork_from(Seq& c, const Seq& parent,
                            const std::vector<std::vector<int32_t>>& tables, BatchStep& out) {
  c.state = SeqState::Running;
  c.arrived = parent.arrived;
  c.first_hit = parent.first_hit;
  c.first_token = true;  // its time to first token is the request's
  if (!tables.empty()) {
    KV_TRY(c.cache->adopt_groups(tables, parent.cache->length()));
    c.hashes = parent.hashes;
    c.published = parent.published;
    running_.push_back(c.id);
  }
  c.cow_seen = c.cache->cow_copies();
  out.events.push_back({EventKind::Fork, c.id, parent.id, {}});
  return Status::Ok();
}

Status Scheduler::fork_samples(Seq& s, BatchStep& out) {
  std::vector<std::vector<int32_t>> tables;
  for (int g = 0; g < s.cache->n_groups(); ++g) tables.push_back(s.cache->blocks(g));
  const std::vector<int> samples = std::move(s.samples);
  s.samples.clear();
  for (int id : samples) {
    Seq& c = *seqs_[size_t(id)];
    c.fork_of = -1;
    KV_TRY(fork_from(c, s, tables, out));
    c.logits = s.logits;
    StepRow row;
    row.seq = c.id;
    row.pos0 = c.cache->length();
    row.tokens = 0;  // nothing computed: the prompt's blocks are the request's
    sample_next(c, row);
    record_tables(c, row);
    out.rows.push_back(std::move(row));
    check_stop(c, out);
  }
  return Status::Ok();
}

void Scheduler::note_first_token(Seq& s) {
  if (s.first_token) return;
  s.first_token = true;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.arrived)
          .count();
  const bool hit = s.first_hit > 0;
  double& mean = hit ? stats_.ttft_hit_ms : stats_.ttft_miss_ms;
  int& n = hit ? stats_.ttft_hits : stats_.ttft_misses;
  mean += (ms - mean) / ++n;
}

int Scheduler::seats_held() const {
  int n = int(running_.size());
  for (int b : open_beams_) {
    const BeamSet* set = beam_sets_[size_t(b)].get();
    if (!set->started) continue;
    int running = 0;
    for (int id : set->live) running += seqs_[size_t(id)]->state == SeqState::Running;
    n += std::max(0, set->K - running);
  }
  return n;
}

std::vector<BeamHypothesis> Scheduler::beam_hypotheses(int first) const {
  for (const auto& set : beam_sets_) {
    if (!set || set->root != first) continue;
    std::vector<BeamHypothesis> h = set->hyps;
    std::stable_sort(h.begin(), h.end(), [](const BeamHypothesis& x, const BeamHypothesis& y) {
      return x.score > y.score;
    });
    if (int(h.size()) > set->K) h.resize(size_t(set->K));
    return h;
  }
  return {};
}

std::vector<int> Scheduler::live_beams(int seq) const {
  if (seq < 0 || seq >= int(seqs_.size()) || !seqs_[size_t(seq)]) return {};
  const int b = seqs_[size_t(seq)]->beam;
  if (b < 0 || !beam_sets_[size_t(b)] || beam_sets_[size_t(b)]->done) return {};
  return beam_sets_[size_t(b)]->live;
}

Status Scheduler::select_beams(BatchStep& out) {
  // select() may end a search (open_beams_ then loses it): walk a copy.
  const std::vector<int> open = open_beams_;
  for (int i : open) {
    BeamSet* set = beam_sets_[size_t(i)].get();
    if (!set->started || set->done || set->live.empty()) continue;
    bool all = true;
    for (int id : set->live) {
      const Seq& b = *seqs_[size_t(id)];
      all = all && b.state == SeqState::Running && b.ready;
    }
    if (all) KV_TRY(select(*set, out));
  }
  return Status::Ok();
}

Expected<Scheduler::Seq*> Scheduler::branch(Seq& parent, bool adopt, BatchStep& out) {
  auto c = std::make_unique<Seq>();
  c->id = int(seqs_.size());
  c->req = parent.req;
  c->state = SeqState::Running;
  c->tokens = parent.tokens;
  c->gen = parent.gen;
  c->logprob = parent.logprob;
  c->beam = parent.beam;
  c->stream = parent.stream;
  c->text = parent.text;
  auto cache = backend_->create_paged_kv_cache(cache_cfg_, pool_);
  if (!cache.ok()) return cache.error();
  c->cache = std::move(*cache);
  std::vector<std::vector<int32_t>> tables;
  if (adopt)
    for (int g = 0; g < parent.cache->n_groups(); ++g) tables.push_back(parent.cache->blocks(g));
  Seq* p = c.get();
  seqs_.push_back(std::move(c));
  KV_TRY(fork_from(*p, parent, tables, out));
  return p;
}

Status Scheduler::select(BeamSet& set, BatchStep& out) {
  const int V = model_->config().n_vocab, K = set.K;
  if (end_ids_.empty()) end_ids_ = generation_end_ids(model_->tokenizer());
  const auto ends = [&](int32_t t) {
    return cfg_.stop_at_eos && std::binary_search(end_ids_.begin(), end_ids_.end(), t);
  };
  struct Cand {
    double logprob;
    int parent;  // index into set.live
    int32_t token;
  };
  std::vector<Cand> cands;
  std::vector<std::pair<int32_t, double>> top;
  for (size_t b = 0; b < set.live.size(); ++b) {
    const Seq& p = *seqs_[size_t(set.live[b])];
    beam_candidates(p.logits.data(), V, 2 * K, top);
    for (const auto& [id, l] : top) cands.push_back({p.logprob + l, int(b), id});
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Cand& x, const Cand& y) { return x.logprob > y.logprob; });
  const int len = int(seqs_[size_t(set.live[0])]->gen.size()) + 1;  // with this step's token
  std::vector<Cand> next, ended;
  for (const Cand& cd : cands) {
    if (int(next.size()) == K) break;
    (ends(cd.token) ? ended : next).push_back(cd);
  }
  double best = -std::numeric_limits<double>::infinity();
  for (const BeamHypothesis& h : set.hyps) best = std::max(best, h.score);
  for (const Cand& cd : ended) best = std::max(best, beam_score(cd.logprob, len, set.length_penalty));
  bool can_beat = false;
  for (const Cand& cd : next)
    can_beat = can_beat || beam_can_beat(cd.logprob, len, set.max_tokens, set.length_penalty, best);
  const bool done = len >= set.max_tokens || next.empty() || !can_beat;

  // Rows: a beam that ran this step has one; the others (and new beams) get one of no tokens.
  const auto row_of = [&](const Seq& s) -> size_t {
    for (size_t i = out.rows.size(); i-- > 0;)
      if (out.rows[i].seq == s.id) return i;
    StepRow r;
    r.seq = s.id;
    r.pos0 = s.cache->length();
    r.tokens = 0;
    out.rows.push_back(std::move(r));
    return out.rows.size() - 1;
  };
  const auto put = [&](Seq& s, int32_t t, double logprob) {
    s.logprob = logprob;
    s.ready = false;
    StepRow& r = out.rows[row_of(s)];
    emit(s, t, r);
    if (r.tokens == 1 && !r.is_prompt) {  // a decode row
      ++stats_.decode_rows;
      ++stats_.decode_row_tokens;
    }
    record_tables(s, r);
  };
  // New sequences first, each from its parent's tokens before the step's own token.
  std::vector<Seq*> made(next.size(), nullptr);
  std::vector<char> continued(set.live.size(), 0);
  for (size_t i = 0; i < next.size(); ++i) {
    const int p = next[i].parent;
    if (!continued[size_t(p)]) {
      continued[size_t(p)] = 1;
      continue;  // goes on in its parent
    }
    auto c = branch(*seqs_[size_t(set.live[size_t(p)])], !done, out);
    if (!c.ok()) return c.error();
    made[i] = *c;
    put(*made[i], next[i].token, next[i].logprob);
  }
  for (const Cand& cd : ended) {  // finished hypotheses: a sequence each, ended at once
    auto c = branch(*seqs_[size_t(set.live[size_t(cd.parent)])], false, out);
    if (!c.ok()) return c.error();
    put(**c, cd.token, cd.logprob);
    set.hyps.push_back({(*c)->id, cd.logprob, beam_score(cd.logprob, len, set.length_penalty), true});
    finish(**c, StopReason::Eos, out);
  }
  std::vector<int> live;
  for (size_t i = 0; i < next.size(); ++i) {
    if (!made[i]) {
      made[i] = seqs_[size_t(set.live[size_t(next[i].parent)])].get();
      put(*made[i], next[i].token, next[i].logprob);
      if (made[i]->id == set.root) note_first_token(*made[i]);
    }
    live.push_back(made[i]->id);
  }
  // Beams no continuation kept give their blocks back now.
  for (size_t b = 0; b < set.live.size(); ++b)
    if (!continued[b]) finish(*seqs_[size_t(set.live[b])], StopReason::Pruned, out);
  set.live = std::move(live);
  if (done) {
    for (int id : set.live) {
      Seq& s = *seqs_[size_t(id)];
      set.hyps.push_back({id, s.logprob, beam_score(s.logprob, len, set.length_penalty), false});
      finish(s, len >= set.max_tokens ? StopReason::MaxTokens : StopReason::SearchDone, out);
    }
    set.live.clear();
    set.done = true;
    std::erase(open_beams_, set.index);
  }
  return Status::Ok();
}

}  // namespace kvscope
