// session.h — the step-by-step generation loop and what each step reports.
//
// A Session owns a backend, a pool of KV blocks (engine/kv_pool.h: enough for the whole
// context, its memory touched only as blocks are used) and, in CACHE mode, a paged KV
// cache over it: one sequence served from the same kind of pool a batch is (a batch of
// one). reset() tokenizes a prompt;
// each step() runs one forward pass and samples one token:
//   CACHE:    the forward processes every token not yet in the cache (the whole prompt
//             on the first step, one token afterwards) and appends their K/V.
//   NO_CACHE: the forward processes the whole sequence into a scratch cache (blocks of
//             the same pool) that is discarded afterwards — the real quadratic loop.
// Switching NO_CACHE -> CACHE rebuilds the cache with one prefill on the next step;
// CACHE -> NO_CACHE frees it. Both modes give the same tokens (greedy).
//
// Context shift (KvLimits::on_full == Shift): when the sequence reaches the context
// size, the next step first drops positions [n_keep, n_keep + n) (n = half of those
// after n_keep, kv_shift_discard) from the sequence and the cache, whose later K rows
// are re-rotated to their new positions (kv_shift, forward.h). The session records each
// shift (where in the token history it happened), and NO CACHE — or a cache rebuilt
// after a mode switch — replays the history with the same shifts at the same points, so
// both modes still compute the same numbers.
// A Session is used from one thread at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_policy.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "common/status.h"

namespace kvscope {

enum class CacheMode { Cache, NoCache };
const char* cache_mode_name(CacheMode m);  // "cache" / "nocache"

// Pruned and SearchDone end beams of a beam search (engine/scheduler.h): a beam no
// candidate of the step continued, and a live beam when the search ended because none
// could beat the best finished hypothesis.
enum class StopReason { None, Eos, MaxTokens, StopString, ContextFull, StopToken, Pruned, SearchDone };
// "none", "eos", "max_tokens", "stop_string", "context_full", "stop_token", "pruned",
// "search_done"
const char* stop_reason_name(StopReason r);

struct PromptSpec {
  std::string text;
  bool chat = false;     // wrap as one user turn in the model's chat template
  bool special = false;  // raw text in which special tokens (<|im_start|>, ...) are parsed
};

// The tokens that end a run (with stop_at_eos): end-of-generation tokens and every other
// control token but BOS.
std::vector<int32_t> generation_end_ids(const Tokenizer& tok);

// The prompt's token ids as a session starts from them: BOS when the model adds one, then
// the text (wrapped in the chat template when asked). Errors: empty text, invalid UTF-8.
Expected<std::vector<int32_t>> tokenize_prompt(const Model& model, const PromptSpec& prompt);

struct SessionConfig {
  CacheMode mode = CacheMode::Cache;
  KvTypes kv_types;                       // K and V element types of the cache
  KvPolicy kv_policy = KvPolicy::ModelWindow;  // which positions windowed layers keep
  KvLimits limits;  // context size, what happens when it is full, sink + window (kv_policy.h)
  int kv_block = 16;  // positions per block of the KV pool (kv_block_size_ok)
  int max_tokens = 256;                   // generated tokens, then StopReason::MaxTokens
  std::vector<std::string> stop_strings;  // stop when the generated text contains one
  std::vector<int32_t> stop_ids;          // stop when one of these tokens is sampled
  // Generated tokens before the run may end: until then end-of-generation tokens and
  // stop_ids cannot be sampled (their logits are -inf); stop strings still stop it.
  int min_tokens = 0;
  bool stop_at_eos = true;
  int top_candidates = 10;  // candidates kept in each StepTrace
  // Measure the quantization error of every K/V row written (StepTrace::k_err, v_err).
  // Off by default: a normal run pays nothing for it.
  bool kv_errors = false;
  // Sample on the device where the backend can (Backend::can_sample_on_device, the CUDA
  // backend): a plain decode step then sends only the candidates to the host, not the V
  // logits (engine/device_sampling.h); steps the candidates cannot settle, steps with
  // logit shaping, teacher-forced and speculative steps take the whole row as before.
  // The tokens and candidates are the same either way.
  bool device_sampling = true;
  // Copy each step's attention rows (StepTrace::attention) to the host: what the scene
  // draws. Off, they stay in the backend's memory and the trace carries none (n_attn 0).
  bool attention_rows = true;
};

struct Candidate {
  int32_t id = 0;
  std::string text;  // token bytes, lossy-decoded to valid UTF-8 for display
  float p = 0;       // probability after temperature (softmax of the full distribution)
  float logit = 0;   // what the sampler saw: after the penalties (SamplerConfig::penalties)
  float raw_logit = 0;  // the model's own logit, before them
};

// One layer's KV cache after a step.
struct KvLayerState {
  int window = 0;              // attention window of the layer (0: all earlier positions)
  int sink = 0;                // positions [0, sink) stay visible whatever the window
  std::vector<KvRange> held;   // positions in its cache, ascending (empty in NO CACHE)
  uint64_t bytes = 0;          // bytes those rows take
};

struct PromptToken {
  int32_t id = 0;
  std::string text;  // display text (valid UTF-8)
};

// Everything one step hands to the app. Immutable once produced.
struct StepTrace {
  int step = 0;          // 1-based step index since reset
  int32_t token_id = 0;  // the sampled token
  std::string piece;     // its raw bytes
  std::string text;      // display text of the token (valid UTF-8, lossy)
  std::string emitted;   // streamed text this step completes (never half a character)
  int pos = 0;           // position of the sampled token in the sequence
  bool is_prompt = false;
  StopReason stop = StopReason::None;
  // The context shift done at the start of this step (shift_n == 0: none): positions
  // [shift_first, shift_first + shift_n) were dropped and every later one moved down by
  // shift_n, its K row re-rotated. shifted_total counts the positions dropped since reset.
  int shift_first = 0, shift_n = 0, shifted_total = 0;

  std::vector<PromptToken> prompt;  // the prompt tokens, on the step that processed them
  std::vector<Candidate> top;       // best first; sampled_rank is the sampled one's index
  int sampled_rank = -1;            // -1 if the sampled token is not in `top`

  // Attention of the step's newest query (position pos-1) over positions [0, n_attn):
  // attention[(l * n_head + h) * n_attn + j]; 0 at positions the layer does not see
  // (outside its window).
  int n_layer = 0, n_head = 0, n_attn = 0;
  std::vector<float> attention;

  // K/V rows written this step: positions [kv_first_pos, kv_first_pos + kv_written);
  // k_norm[l * kv_written + i] is the L2 norm of layer l's K row at that position.
  int kv_first_pos = 0, kv_written = 0;
  std::vector<float> k_norm, v_norm;
  // Only when measured (SessionConfig::kv_errors, on a backend that can: see
  // Backend::kv_row_errors): the relative error of each row written this step as the cache
  // stores it, ||x - stored(x)|| / ||x|| over all KV heads, x the f32 row before it was
  // converted to the cache's K (or V) type; [L][kv_written] like k_norm. Empty otherwise.
  std::vector<float> k_err, v_err;

  // Per layer: its window and which positions its cache holds (a windowed layer's held
  // range starts at the window start: older positions were evicted).
  std::vector<KvLayerState> kv_layers;

  // Speculative decoding (Session::set_speculation), on the step that ran the
  // verification: the drafted tokens, how many the target kept (-1: no speculation this
  // step), the K/V rows rolled back (drafted - accepted) and the drafter's FLOPs (also in
  // `flops`). The kept tokens are emitted by the next steps, which run no forward
  // (tokens_processed 0) and carry no attention rows (n_attn 0), like this one.
  std::vector<int32_t> drafted;
  int accepted = -1;
  int rolled_back = 0;
  uint64_t draft_flops = 0;

  CacheMode mode = CacheMode::Cache;
  uint64_t flops = 0, flops_total = 0;      // multiply-adds x2 of this step / since reset
  uint64_t kv_rows = 0, kv_rows_total = 0;  // K/V rows computed (tokens processed x layers)
  // Bytes of the KV blocks the cache holds after the step, partly used ones whole (0 in
  // NO_CACHE).
  uint64_t kv_bytes = 0;
  uint64_t kv_transient_bytes = 0;  // K/V rows' bytes computed this step and thrown away (NO_CACHE)
  int seq_len = 0;                  // tokens in the sequence after the step
  int tokens_processed = 0;         // tokens through the forward this step
  double ms = 0;                    // wall time of the step (forward + sampling)
  double device_ms = -1;            // device time (CUDA events), -1 when not measured
  std::string backend;
};

struct ForwardOutput;  // engine/forward.h

class Session {
 public:
  static Expected<std::unique_ptr<Session>> create(std::shared_ptr<const Model> model,
                                                   std::unique_ptr<Backend> backend,
                                                   SessionConfig config);
  ~Session();

  // Tokenizes the prompt and clears the sequence and cache. Errors: empty prompt,
  // invalid UTF-8, prompt longer than the context.
  Status reset(const PromptSpec& prompt);
  // The same with the prompt given as token ids (no BOS is added). Errors: no tokens,
  // an id outside the vocabulary, more tokens than the context.
  Status reset_tokens(std::vector<int32_t> ids);
  // Runs one step. Error if the session is done (check done()) or the backend fails.
  Expected<StepTrace> step();
  // Teacher forcing: runs one step like step() but appends `id` instead of sampling
  // (the sampler is not consulted). The trace's candidates are the model's own
  // distribution; sampled_rank is where `id` stands among them (-1 if not in `top`).
  Expected<StepTrace> step_forced(int32_t id);
  bool done() const { return stop_ != StopReason::None; }
  StopReason stop_reason() const { return stop_; }

  Status set_mode(CacheMode mode);
  CacheMode mode() const { return config_.mode; }
  void set_sampler(const SamplerConfig& s);
  const SamplerConfig& sampler() const { return sampler_cfg_; }
  void set_max_tokens(int n) { config_.max_tokens = n; }
  void set_kv_errors(bool on) { config_.kv_errors = on; }  // from the next step on
  // Speculative decoding from the next step on (c.kind None: off): ngram and early-exit
  // need nothing else; a draft model comes with its own backend (its vocabulary must be
  // this model's). Errors: a bad layer count or draft_max, another vocabulary.
  Status set_speculation(const SpeculativeConfig& c, std::shared_ptr<const Model> draft_model = nullptr,
                         std::unique_ptr<Backend> draft_backend = nullptr);
  struct SpeculationStats {
    uint64_t drafted = 0, accepted = 0, verify_forwards = 0;
  };
  const SpeculationStats& speculation_stats() const { return spec_; }
  const SessionConfig& config() const { return config_; }

  const Model& model() const { return *model_; }
  // The model, shared: another Session on the same weights (the app's interleaved compare).
  std::shared_ptr<const Model> shared_model() const { return model_; }
  const Backend& backend() const { return *backend_; }
  // The sequence in the context: after a context shift, without the dropped tokens.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // Every token since reset, dropped ones included.
  const std::vector<int32_t>& history() const { return history_; }
  int prompt_len() const { return prompt_len_; }
  int generated() const { return int(history_.size()) - prompt_len_; }
  int context_limit() const;  // the most tokens a sequence may hold
  std::string generated_text() const;
  // Raw logits [V] of the last step, before any penalty (for tests and tools).
  // After a step sampled on the device the row is fetched from it here, on first use.
  const std::vector<float>& last_logits() const;
  // Steps that sampled on the device, and those of them the candidates could not settle
  // (they downloaded the row): for tests and tools.
  struct DeviceSamplingStats {
    uint64_t steps = 0, fallbacks = 0;
  };
  const DeviceSamplingStats& device_sampling_stats() const { return device_stats_; }
  uint64_t kv_bytes() const;

 private:
  Session() = default;
  Expected<StepTrace> run_step(std::optional<int32_t> forced);
  // A context shift recorded in the history: once history_[0, at) had gone through the
  // forward, positions [first, first + n) were dropped.
  struct ShiftEvent {
    int at = 0, first = 0, n = 0;
  };
  // Runs history_ through the forward into the empty `cache` with the recorded shifts at
  // their points; `fo` is the last chunk's output (positions [*pos0, *pos0 + *T)), with
  // the FLOPs and K/V rows of every chunk.
  Status replay(KvCache& cache, ForwardOutput& fo, int* pos0, int* T);
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  SessionConfig config_;
  SamplerConfig sampler_cfg_;
  Sampler sampler_;
  // The pool for the cache's configuration `cfg` (made on first use).
  Status ensure_pool(const KvCacheConfig& cfg);
  std::shared_ptr<KvPool> pool_;    // made by the first step
  std::unique_ptr<KvCache> cache_;  // CACHE mode only
  std::vector<int32_t> tokens_;
  std::vector<int32_t> history_;
  std::vector<ShiftEvent> shifts_;
  std::vector<PromptToken> prompt_tokens_;
  int prompt_len_ = 0;
  int steps_ = 0;
  bool prompt_reported_ = false;
  StopReason stop_ = StopReason::None;
  // logits_ is filled on demand (last_logits) after a step sampled on the device.
  mutable std::vector<float> logits_;
  // Buffers run_step reuses from step to step instead of allocating a vocabulary's worth
  // each: the one the next forward's logits land in (logits_'s before), the softmax.
  std::vector<float> spare_logits_, softmax_;
  mutable bool logits_on_device_ = false;
  DeviceSamplingStats device_stats_;
  std::vector<float> shaped_;          // logits_ after the penalties and the minimum length
  // Speculation.
  struct Queued {  // a verified token not emitted yet
    int32_t id = 0;
    int pos = 0;  // the position of the token its step writes (the one before it)
    std::vector<float> raw, shaped, k_norm, v_norm;
  };
  std::unique_ptr<Drafter> drafter_;
  int draft_max_ = 4;
  std::mt19937_64 spec_rng_;
  std::vector<std::vector<float>> draft_q_;
  std::vector<int32_t> verify_;
  std::deque<Queued> queue_;
  SpeculationStats spec_;
  std::vector<int32_t> end_ids_;       // tokens min_tokens holds back (made on first use)
  std::string gen_bytes_;      // raw bytes of the generated tokens
  Utf8Stream stream_;          // streamed bytes not yet emitted
  uint64_t flops_total_ = 0, kv_rows_total_ = 0;
};

// One line describing a configuration, e.g. "kv f16, ctx 8192, sink 4 + window 256".
std::string describe_kv_config(const SessionConfig& cfg, int model_ctx);

}  // namespace kvscope
