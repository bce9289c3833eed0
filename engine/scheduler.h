// scheduler.h — continuous batching: many requests served from one pool of KV blocks.
//
// Requests arrive (each at a step of its own), wait in a first-come-first-served queue,
// run, and leave. Every step() is one forward_batch (engine/forward.h) over:
//   1. the running sequences, oldest first: one decode token each, or the next chunk of a
//      prompt that did not fit in one step;
//   2. then waiting requests, admitted in arrival order while the step's token budget
//      (max_batch_tokens) and the number of running sequences (max_seqs) allow. A prompt
//      longer than the budget left is cut into chunks. A request's prompt first looks its
//      full blocks up in the pool's prefix cache; the blocks found are adopted and their
//      prefill skipped.
// Blocks come from the pool as positions arrive. A prompt chunk the pool cannot hold
// whole shrinks to what it can. When the pool cannot give a running sequence the block
// its next token needs, the newest running sequence is preempted by recompute (and no
// waiting request is admitted in that step): its blocks go back (published ones stay cached), and it returns to the head
// of the queue with its prompt and the tokens generated so far, to be prefilled again
// (often from the prefix cache). A finished sequence leaves at once and frees its blocks.
// Each sequence samples with its own Sampler (the request's seed), so its tokens do not
// depend on what else runs; greedy, its tokens and logits are those of the same prompt
// run alone (the forward is batch-invariant on the CPU).
// Parallel sampling: a request with n > 1 samples is one sequence until its prompt is
// computed; at the step that samples its first token it forks n - 1 more sequences that
// adopt its block table (every prompt block then has n references, nothing is computed
// again) and sample their own first tokens from the same logits, each with its own seed
// (sample_seed). The partly filled last prompt block is copied by each sample that writes
// into it while another still shares it (copy-on-write): n - 1 copies, no more.
// Speculative decoding (SchedulerConfig::speculation: ngram, early-exit:L or a draft
// model): a running
// sequence in decode drafts up to draft_max tokens after its last one, and its row of the
// step carries the last token and the draft (k + 1 positions, every row's logits). Drafts
// take only what the step leaves once the running sequences and the admitted requests are
// planned: tokens of the budget, and free blocks (never a cached one), so they change no
// other scheduling decision. speculative_accept (engine/speculative.h) keeps a prefix of
// the draft as the Session does (greedy: argmax, the tokens and logits exactly plain
// greedy's; sampling: Leviathan's rule with the sequence's own generator, seeded from its
// seed), each position's logits shaped by the penalties and the minimum length with the
// draft prefix before it. The cache is cut back over the rejected rows (a Rollback event;
// whole blocks go back to the pool, before any block is published), and the accepted
// tokens and the one after them are all emitted in that step, each checked against the
// stop conditions in turn. A sequence that asks for log-probabilities does not draft.
// Beam search (Request::beams = K): the request's prompt runs as one sequence; then each
// step its K live beams (sequences) compute their newest token together, and once every
// live beam of the request has fresh logits (a preempted beam is waited for) the step
// selects as beam_search (engine/beam_search.h) does: each beam's 2K most likely
// continuations scored by their summed log-probabilities (log softmax of the model's
// logits: the sampler and temperature do not apply), the K best that do not end the
// sequence kept, in rank order. A beam's best-ranked continuation goes on in that beam;
// each further one is a new sequence (a Fork event, a fresh id at the end) that adopts the
// beam's block table, so beams share every block they have in common and copy a shared
// block only when they write into it. A beam no continuation kept finishes as Pruned in
// that step and its private blocks return to the pool. A continuation that is an
// end-of-generation token is a finished hypothesis: a sequence of its own that ends at
// once (Eos) and holds nothing. The search ends as beam_search's: after max_tokens, or
// when no live beam can beat the best finished hypothesis (its beams then end as
// SearchDone, their hypotheses kept). beam_hypotheses() gives the K best. A beam request
// holds K of max_seqs from its admission to its end, and the pool must hold K unshared
// copies of its longest sequence.
// Every decision is an Event in the step's trace. A Scheduler is used from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "engine/utf8.h"

namespace kvscope {

struct SchedulerConfig {
  KvTypes kv_types;
  int block_size = 16;
  int pool_blocks = 0;         // 0: enough blocks for one full context
  int context = 0;             // positions a sequence may hold; 0: the model's context
  int max_batch_tokens = 512;  // tokens through one forward
  int max_seqs = 16;           // sequences running at once
  bool prefix_caching = true;
  bool stop_at_eos = true;
  // Attention rows of each sequence's newest query in its StepRow (for the scene).
  bool attention = false;
  // Speculative decoding of every sequence: kind None (off), Ngram, EarlyExit (the
  // model's first `layers` layers, a small cache of its own per sequence) or Model (the
  // draft model given to create(), same vocabulary, a cache of its own per sequence);
  // draft_max tokens at most per step (1..15).
  SpeculativeConfig speculation;
  // Sample on the device where the backend can (the CUDA backend; engine/device_sampling.h)
  // and the sequence's step allows it (no penalties, held-back tokens, log-probabilities,
  // beams or samples to fork): the logits rows stay there, only the candidates come back,
  // and the tokens are the CPU path's. Rows the candidates cannot settle come back whole.
  bool device_sampling = true;
};

struct Request {
  std::vector<int32_t> prompt;  // token ids (tokenize_prompt)
  int max_tokens = 64;
  SamplerConfig sampler;  // its penalties too
  std::vector<int32_t> stop_ids;  // stop when one of these is sampled (StopReason::StopToken)
  int min_tokens = 0;  // end tokens and stop_ids are held back until this many are generated
  int arrival_step = 1;  // the step at which it joins the queue (1: the first step)
  // Samples drawn from the prompt (1..64, at most max_seqs): sample k > 0 is sequence
  // id + k, forked when the prompt is done, with the seed sample_seed(seed, k).
  int n = 1;
  // Log-probabilities: -1 none; k in 0..20: each sampled token's log-probability and the
  // k most likely tokens' (StepRow::logprob, StepRow::top_logprobs), from the logits the
  // sampler sees (after the penalties) at temperature 1.
  int logprobs = -1;
  // Beam search with `beams` beams (0: none; 1..min(64, max_seqs)), scored sum log p /
  // length^length_penalty. Not with n > 1, logprobs, penalties, min_tokens or stop_ids.
  int beams = 0;
  float length_penalty = 1.0f;
};

// One hypothesis of a beam search: the sequence that holds its tokens (generated(seq)),
// their summed log-probability and its score (beam_score, engine/beam_search.h).
struct BeamHypothesis {
  int seq = 0;
  double logprob = 0;
  double score = 0;
  bool finished = false;  // ended by an end-of-generation token (else by the search's end)
};

// The seed of sample k of a request whose seed is `seed` (sample 0 keeps it).
uint64_t sample_seed(uint64_t seed, int k);

enum class SeqState { Pending, Waiting, Running, Finished, Cancelled, Failed };
const char* seq_state_name(SeqState s);

// Fork: `seq` was forked from sequence `n` (its prompt's blocks adopted, its first token
// sampled from the same logits). Rollback: `n` rows of a rejected draft cut off `seq`'s
// cache. New kinds go last: run files store the kind's number.
enum class EventKind {
  Arrive, Admit, PrefixHit, Chunk, Cow, Preempt, Finish, Cancel, Fail, Fork, Rollback
};
const char* event_kind_name(EventKind k);  // "arrive", "admit", "prefix_hit", ...

struct SchedEvent {
  EventKind kind = EventKind::Arrive;
  int seq = 0;
  int n = 0;  // tokens (prefix_hit, chunk, preempt: tokens to recompute; rollback: rows),
              // blocks (cow)
  std::string detail;  // finish: the stop reason; fail: the message
};

// One sequence's part of a step.
struct StepRow {
  int seq = 0;
  int pos0 = 0;               // first position processed this step
  int tokens = 0;             // tokens processed this step (a draft's rows included)
  bool is_prompt = false;     // the tokens were prompt (or recomputed) tokens
  // The tokens emitted this step, in order: one, or with speculation the accepted draft
  // tokens and the one after them (fewer when a stop condition ended the sequence).
  std::vector<int32_t> tokens_out;
  int32_t token_id = -1;      // the last of tokens_out, -1 when none (mid-prompt chunk)
  int pos = 0;                // position of token_id
  std::string text;           // the streamed text of tokens_out (complete characters only)
  // Speculation: the tokens drafted this step (empty: none) and how many of them were
  // accepted; rows pos0 + 1 + accepted .. pos0 + tokens - 1 were rolled back.
  std::vector<int32_t> drafted;
  int accepted = 0;
  int rolled_back() const { return int(drafted.size()) - accepted; }
  int blocks = 0;             // blocks the sequence holds after the step (all groups)
  std::vector<int32_t> table;  // the (first group's) block table after the step
  // Every group's table, when the model's windows split the layers into groups
  // (KvLayerGroups); empty for one group. -1: a block given back outside the window.
  std::vector<std::vector<int32_t>> tables;
  std::vector<float> attention;  // [L][H][pos0 + tokens] when SchedulerConfig::attention
  // When the request asked for them (Request::logprobs >= 0) and a token was sampled: its
  // log-probability, and the most likely tokens' (most likely first, ties: lower id).
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

struct PoolState {
  KvPoolCounts counts;
  int block_size = 0;
  int held_positions = 0;    // positions the used blocks hold (a shared block counted once)
  int allocated_slots = 0;   // used blocks x block size
};

struct BatchStep {
  int step = 0;
  std::vector<StepRow> rows;  // decode rows first, then prompt chunks
  std::vector<SchedEvent> events;
  PoolState pool;
  int batch_tokens = 0;
  int running = 0, waiting = 0;
  double ms = 0;  // wall time of the forward and sampling
};

// Totals since the scheduler was made.
struct SchedulerStats {
  int steps = 0;
  int finished = 0;
  uint64_t peak_kv_bytes = 0;        // the pool's used blocks at their peak, in bytes
  // Peak of the blocks the running sequences' tables hold, a shared block counted once per
  // table: what the pool would need if nothing were shared (forks, prefix hits).
  uint64_t unshared_kv_bytes = 0;
  uint64_t contiguous_kv_bytes = 0;  // peak of (running sequences x context) positions, in bytes
  double slot_utilization = 0;       // over all steps: held positions / allocated slots
  double contiguous_utilization = 0;  // the same for contiguous per-sequence reservations
  double internal_fragmentation = 0;  // empty slots in sequences' last blocks / allocated
  uint64_t prefix_hit_tokens = 0;
  uint64_t prefill_tokens = 0;       // prompt (and recomputed) tokens run through the forward
  uint64_t decode_tokens = 0;        // tokens sampled
  int preemptions = 0;
  int cow_copies = 0;
  // Speculation: tokens drafted and accepted; decode rows (one sequence's one target
  // forward position set: a plain decode token or a verified draft) and the tokens they
  // emitted. Tokens per target forward = decode_row_tokens / decode_rows.
  uint64_t drafted = 0, accepted = 0;
  uint64_t decode_rows = 0, decode_row_tokens = 0, verify_rows = 0;
  // Rows sampled on the device (SchedulerConfig::device_sampling), and those of them whose
  // candidates could not settle the token (their logits row came back to the host).
  uint64_t device_sampled = 0, device_fallbacks = 0;
  double ms = 0;                     // total step time
  // Time to first token (from the start of the step a request arrived in to the end of
  // the step that sampled its first token), mean over requests whose first admission
  // found blocks in the prefix cache (hits) and over the others (misses).
  double ttft_hit_ms = 0, ttft_miss_ms = 0;
  int ttft_hits = 0, ttft_misses = 0;
};

class Scheduler {
 public:
  // `draft` and its backend: the draft model of speculation kind Model (else unused).
  static Expected<std::unique_ptr<Scheduler>> create(
      std::shared_ptr<const Model> model, Backend& backend, SchedulerConfig config,
      std::shared_ptr<const Model> draft = nullptr, std::unique_ptr<Backend> draft_backend = nullptr);
  ~Scheduler();

  // Queues a request; ids number sequences from 0 in the order they were added (a request
  // of n samples takes n consecutive ids and returns the first). An error when the prompt
  // is empty, has an id outside the vocabulary, or cannot fit in the context or the pool,
  // or n is out of range.
  Expected<int> add(Request r);
  // Takes a pending, waiting or running sequence out; its blocks go back. Cancelling a
  // request's first sequence before its samples are forked cancels them too; cancelling
  // a sample not forked yet leaves the others. Error for an unknown or ended id.
  Status cancel(int seq);
  // Frees an ended (finished, cancelled, failed) sequence: its logits, tokens, text,
  // sampler (a server's long run would otherwise grow with every request); a few bytes
  // stay. Its state and stop reason stay; generated(), text() and last_logits() are empty
  // after it. Forgetting it again is no error.
  Status forget(int seq);
  // Nothing pending, waiting or running.
  bool idle() const;
  // One step; the step counter advances even when nothing runs (arrivals are by step).
  Expected<BatchStep> step();

  const SchedulerConfig& config() const { return cfg_; }
  const KvPool& pool() const { return *pool_; }
  const Model& model() const { return *model_; }
  // How the layers share blocks (one group unless the model has attention windows).
  const KvLayerGroups& layer_groups() const { return groups_; }
  const SchedulerStats& stats() const { return stats_; }
  int size() const;  // requests added
  // Ids of the waiting sequences, head of the queue first (a preempted one is at the head).
  const std::vector<int>& waiting_ids() const { return waiting_; }
  SeqState state(int seq) const;
  StopReason stop_reason(int seq) const;
  const std::vector<int32_t>& generated(int seq) const;
  std::string text(int seq) const;  // the generated text so far
  // Logits of the sequence's last sampled token (tests); empty when that token was sampled
  // on the device (SchedulerConfig::device_sampling: the row stayed there).
  const std::vector<float>& last_logits(int seq) const;
  // A beam request's hypotheses so far (first: the id add() returned), best score first,
  // at most K; empty for a request without beams. Final once the request's beams ended.
  std::vector<BeamHypothesis> beam_hypotheses(int first) const;
  // The live beams of the beam request whose beams include `seq`, in rank order (empty
  // when none or the search ended).
  std::vector<int> live_beams(int seq) const;
  // The pool's invariants against every live block table (KvPool::check).
  Status check() const;

 private:
  struct Seq;
  Scheduler() = default;
  Status run_step(BatchStep& out);
  void preempt(Seq& s, BatchStep& out);
  void finish(Seq& s, StopReason r, BatchStep& out);
  void publish_full_blocks(Seq& s);
  struct Planned {
    Seq* s;
    int n;  // tokens through the forward (a draft's rows included)
  };
  // Samples s's next token from s.logits (penalties, minimum length) into s and `row`.
  void sample_next(Seq& s, StepRow& row);
  // The token s draws from `logits` (its penalties and minimum length applied, into
  // `shaped`); end_ids_ made first where a minimum length needs it (draw_tokens).
  int32_t draw_token(Seq& s, const std::vector<float>& logits, std::vector<float>& shaped) const;
  bool holds_back(const Seq& s) const;
  // The tokens of the plan's rows that draw at a temperature on the host (token[i], else
  // -1), every sequence at once over the backend's threads: each draws from its own
  // sampler, so the tokens are those sample_next would draw one by one.
  void draw_tokens(const std::vector<Planned>& plan, const std::vector<BatchSeq>& batch,
                   const std::vector<BatchSeqOutput>& fo, const std::vector<int32_t>& dev_token,
                   std::vector<int32_t>& token);
  // Candidates a sequence's next token needs from the device, 0 when its step samples on
  // the host (see SchedulerConfig::device_sampling).
  int device_sample_n(const Seq& s) const;
  // Samples the plan's rows whose logits stayed on the device (token[i], else -1; a row
  // whose candidates could not settle it comes back into fo[i].logits).
  Status sample_on_device(const std::vector<Planned>& plan, std::vector<BatchSeqOutput>& fo,
                          std::vector<int32_t>& token);
  // Finishes s when its last token ends it.
  void check_stop(Seq& s, BatchStep& out);
  // Why s's last token ends it (None: it goes on).
  StopReason stop_for(const Seq& s) const;
  // Drafts for the planned decode rows with what the step left (tokens, free blocks).
  Status plan_drafts(std::vector<Planned>& plan, int& budget, int& reserved);
  // Blocks s needs from the pool to write n more tokens: new blocks, plus a copy of a
  // shared or published last block it would write into.
  int blocks_needed(const Seq& s, int n) const;
  // Verifies s's draft against `logits` [k + 1][V], rolls the cache back over the
  // rejected rows and emits the kept tokens into s and `row`; the stop reason, if any.
  Expected<StopReason> accept_draft(Seq& s, std::vector<float>& logits, StepRow& row,
                                    BatchStep& out);
  // Appends token t to s (its text into row).
  void emit(Seq& s, int32_t t, StepRow& row);
  // The row's block tables (every group's when there are several) and held blocks, from s.
  void record_tables(const Seq& s, StepRow& row) const;
  // Makes c a running fork of `parent` (a Fork event): with `tables` (the parent's, every
  // group's) it adopts them and the parent's published hashes; empty, it holds nothing
  // (a beam hypothesis that ends at once).
  Status fork_from(Seq& c, const Seq& parent, const std::vector<std::vector<int32_t>>& tables,
                   BatchStep& out);
  // Forks s's pending samples off s (its prompt computed, its logits fresh).
  Status fork_samples(Seq& s, BatchStep& out);
  uint64_t group_hash(uint64_t chain, int g) const;
  // Beam search: the requests whose live beams all have fresh logits take their step.
  struct BeamSet;
  Status select_beams(BatchStep& out);
  Status select(BeamSet& set, BatchStep& out);
  // A new beam after `parent` (its tokens, cache table when `adopt`, score), running.
  Expected<Seq*> branch(Seq& parent, bool adopt, BatchStep& out);
  // Sequences running plus the seats beam requests hold for beams not running.
  int seats_held() const;
  void note_first_token(Seq& s);
  // On an empty cache: adopts the longest prefix the pool's prefix cache holds in every
  // group; *hit = positions adopted.
  Status adopt_prefix(Seq& s, int* hit);
  void record_pool(BatchStep& out);

  std::shared_ptr<const Model> model_;
  Backend* backend_ = nullptr;
  std::shared_ptr<const Model> draft_model_;  // speculation kind Model
  std::unique_ptr<Backend> draft_backend_;
  SchedulerConfig cfg_;
  KvCacheConfig cache_cfg_;
  KvLayerGroups groups_;
  uint64_t salt_ = 0;
  std::shared_ptr<KvPool> pool_;
  std::vector<int32_t> end_ids_;  // generation_end_ids, made when a minimum length needs it
  std::vector<float> shaped_;     // a sequence's logits after its penalties
  std::vector<std::unique_ptr<Seq>> seqs_;  // null once forgotten
  struct Gone {
    SeqState state = SeqState::Finished;
    StopReason stop = StopReason::None;
  };
  std::vector<Gone> gone_;  // what a forgotten sequence leaves (by id)
  // By request, in the order added; a set is dropped (null) once it is done and its first
  // sequence is forgotten. open_beams_ lists the sets not done yet, so that what runs each
  // step (seats_held, select_beams) never walks ended searches.
  std::vector<std::unique_ptr<BeamSet>> beam_sets_;
  std::vector<int> open_beams_;
  std::vector<int> waiting_;  // ids, head first
  std::vector<int> running_;  // ids, in admission order
  int step_ = 0;
  std::chrono::steady_clock::time_point step_start_;
  SchedulerStats stats_;
  uint64_t held_sum_ = 0, alloc_sum_ = 0, last_empty_sum_ = 0, contiguous_sum_ = 0,
           contiguous_held_sum_ = 0;
};

}  // namespace kvscope
