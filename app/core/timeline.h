// timeline.h — the current run as the UI sees it: every step, the tokens, the K/V norms per
// position, and which step is being looked at.
//
// Owned by the UI thread; fed from Controller events in order. The NO CACHE steps of an
// interleaved comparison (CompareStep events) go to the run history only.
//
// Memory stays bounded at thousands of steps: only the newest step (and the one being
// viewed, if older) is held with its attention rows and K/V norms. Older steps are kept
// "slim" (token, candidates, counters, timings: about 1 KB each); their full trace lives in
// the run's store — the controller's history spool, or the recording being replayed — and is
// read back by offset when the person scrubs to it. K/V norms are merged into one row per
// layer and position. The run history (measured per-step series of earlier runs, per prompt
// and mode) survives Reset.
//
// Positions are 0-based everywhere. Step k writes position pos_k (its sampled token); its
// query is the token at pos_k - 1; after it the sequence holds pos_k + 1 tokens.
//
// Context shifts renumber positions: a step with shift_n > 0 first dropped positions
// [shift_first, shift_first + shift_n) and moved every later one down by shift_n. tokens()
// and the K/V norms are kept in arrival order (every token of the run, dropped ones too:
// the transcript shows them all); position p as a step's sequence holds it is entry
// token_index(p) (the identity until the first shift).
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/core/controller.h"
#include "app/core/run_history.h"

namespace kvscope::app {

struct TokenInfo {
  int32_t id = 0;
  std::string text;
  bool prompt = false;
  int step = 0;  // step that sampled it (0 for prompt tokens)
};

// Speeds over the recent steps, all from the worker's own clock (see Timeline::speed()).
// Decode rates are one cache mode's: a step in the other mode starts the window again, so a
// rate never averages a KV CACHE step with a NO CACHE one.
struct SpeedStats {
  double ttft_ms = -1;         // step 1 (prefill in KV CACHE mode): its engine time
  int prefill_tokens = 0;      // tokens through step 1's forward
  double prefill_tok_s = 0;    // prefill_tokens / step 1's time
  double engine_tok_s = 0;     // later steps: tokens generated per second of engine time
  double delivered_tok_s = 0;  // later steps: per second of wall time between them
  int window = 0;              // steps the two rates above are measured over
  CacheMode mode = CacheMode::Cache;  // the mode of those steps
  int mode_since = 0;                 // the first step of this run in that mode since a switch
  // The other mode's engine rate when this run last switched away from it (0: never ran).
  double other_engine_tok_s = 0;
};

// The run id under which the history files the NO CACHE run of an interleaved comparison
// whose KV CACHE run is `run` (the two would otherwise share one id).
constexpr uint64_t interleaved_run(uint64_t run) {
  return run | (uint64_t(1) << 63);
}

class Timeline {
 public:
  // Applies one controller event (Reset clears; Step appends). Returns false for events
  // of an older run, which are ignored.
  bool apply(const Event& e);
  void clear();

  // Every step of this run, oldest first. All but the newest (and the viewed one) are slim:
  // their attention, K/V norms and prompt tokens are empty.
  const std::vector<std::shared_ptr<const StepTrace>>& steps() const { return steps_; }
  const StepTrace* last() const { return steps_.empty() ? nullptr : steps_.back().get(); }
  // Every token of the run in arrival order (see the header: not indexed by position once
  // the context has shifted).
  const std::vector<TokenInfo>& tokens() const { return tokens_; }
  // The entry of tokens() at position `pos` of the viewed step's sequence (-1 when out of
  // range), and that token.
  int token_index(int pos) const;
  const TokenInfo* token_at(int pos) const;
  bool shifted() const { return !shifts_.empty(); }  // the context shifted in this run
  // The entry of tokens() that was position `pos` of step `step`'s sequence (-1: none).
  int token_index_at(int pos, int step) const;
  // The position of tokens() entry `index` in the viewed step's sequence (-1: a shift
  // dropped it, or it came later): the inverse of token_index.
  int position_of_index(int index) const;
  // The K (or V) norm of layer `layer` at tokens() entry `index` (NaN: not computed).
  float kv_norm_of_index(int index, int layer, bool v) const;
  // The measured quantization error (StepTrace::k_err) of layer `layer`'s K (or V) row at
  // `pos` of the viewed step, or at tokens() entry `index`; NaN when not measured.
  float kv_error(int pos, int layer, bool v) const;
  float kv_error_of_index(int index, int layer, bool v) const;
  int n_layer() const { return n_layer_; }
  uint64_t run() const { return run_; }
  const std::string& prompt_text() const { return prompt_text_; }
  bool prompt_chat() const { return prompt_chat_; }
  const RunHistory& history() const { return history_; }
  // This run's series and the other mode's last series for the same prompt (nullptr when
  // that mode has not run on it, or when it is this very run).
  const RunSeries* current_series() const;
  const RunSeries* other_series() const;
  // True between a Reset/Step of this run and its Finished event.
  bool finished() const { return finished_; }
  // Why the run ended (nothing while it runs).
  std::optional<FinishReason> finish_reason() const { return finish_reason_; }
  CacheMode mode() const { return mode_; }
  const std::string& generated_text() const { return generated_; }
  // The comparison this run is part of (Interleaved: this is its KV CACHE run), or None
  ComparePhase compare_phase() const { return compare_; }
  const std::shared_ptr<RunFile>& store() const { return store_; }

  // ---- history: which step is looked at ----
  int step_count() const { return int(steps_.size()); }
  bool live() const { return viewed_ == 0; }  // following the newest step
  int viewed_step() const { return viewed_ == 0 ? step_count() : viewed_; }
  // Views step `step` (1-based; the newest step means "follow live"). Reads the step back
  // from the store; if that fails, the slim step is shown and viewed_note() says why.
  void scrub_to(int step);
  void follow_live() { scrub_to(step_count()); }
  // The viewed step (the newest when live); nullptr before the first step.
  const StepTrace* viewed() const;
  // Why the viewed step shows no attention ("" when it has its attention rows).
  const std::string& viewed_note() const { return viewed_note_; }
  // Tokens in the sequence after the viewed step (all tokens before the first step).
  int viewed_seq_len() const;

  // L2 norm of layer `layer`'s K (or V) row at `pos`; NaN when the viewed step had not
  // computed it yet.
  float kv_norm(int pos, int layer, bool v) const;
  // Smallest/largest norm in a layer up to the viewed step (for color scaling), so a step
  // looked at again is colored exactly as it was then.
  float kv_norm_min(int layer, bool v) const;
  float kv_norm_max(int layer, bool v) const;

  SpeedStats speed() const;
  // Bytes this timeline holds (steps, tokens, norms, the full traces it keeps).
  size_t memory_bytes() const;

 private:
  struct Shift {
    int step, first, n;  // the step that shifted, what it dropped
  };
  // The arrival index of position `pos` after the first `n_shifts` shifts.
  int index_after(int pos, size_t n_shifts) const;
  size_t shifts_until(int step) const;  // shifts done by step `step` (inclusive)
  void ensure_layers(int n);
  void merge_norms(const StepTrace& t);
  uint64_t run_ = 0;
  std::string prompt_text_, generated_;
  std::optional<FinishReason> finish_reason_;
  CacheMode mode_ = CacheMode::Cache;
  bool prompt_chat_ = false, finished_ = true;
  ComparePhase compare_ = ComparePhase::None;
  RunHistory history_;
  std::shared_ptr<RunFile> store_;
  std::vector<std::shared_ptr<const StepTrace>> steps_;
  std::vector<uint64_t> offsets_;  // [steps] record offset in store_ (kNoOffset: not kept)
  std::vector<TokenInfo> tokens_;  // in arrival order
  std::vector<Shift> shifts_;      // the run's context shifts, oldest first
  int n_layer_ = 0;
  std::vector<std::vector<float>> k_norm_, v_norm_;   // [L][arrival index]
  std::vector<std::vector<float>> k_err_, v_err_;     // [L][arrival index], NaN: not measured
  std::vector<float> k_min_, k_max_, v_min_, v_max_;  // [L]
  std::vector<float> range_log_;  // [steps][4][L]: k_min, k_max, v_min, v_max after each step
  int viewed_ = 0;                // 0 = live
  std::shared_ptr<const StepTrace> viewed_full_;  // the viewed step read back
  std::string viewed_note_;
  struct Arrival {
    double done_s, ms;
  };
  std::deque<Arrival> arrivals_;  // the last few steps after the first, all in first_.mode
  SpeedStats first_;              // step 1's numbers, the window's mode, the other mode's rate
};

// Returns freed heap pages to the system (after a Reset), where the C library allows it.
void release_free_memory();
// For a process that runs long generations: blocks of 256 KiB and more (attention rows,
// scene instances, scratch caches, which grow by a little every step) are mapped and
// unmapped on their own instead of coming from the heap, where freeing a block that is
// one row too small for the next step's leaves a hole each step and the heap grows with
// the square of the run length.
void use_mapped_memory_for_large_blocks();
// Resident set size of this process in bytes (0 when unknown).
uint64_t process_resident_bytes();
// The most this process has held resident so far (VmHWM; 0 when unknown).
uint64_t process_peak_resident_bytes();
// Starts VmHWM again from the resident size now (Linux /proc/self/clear_refs), so that
// process_peak_resident_bytes() is the exact peak of what follows. False where it cannot.
bool reset_peak_resident();

}  // namespace kvscope::app
