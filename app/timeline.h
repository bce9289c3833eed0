// timeline.h — every StepTrace of the current run, plus what the scene needs per position.
//
// Owned by the UI thread; fed from Controller events in order. Positions [0, seq_len)
// have a token; K/V norms exist for positions whose K/V rows some step has written
// (NaN otherwise). Traces are shared and immutable. The run history (measured per-step
// series of earlier runs, per prompt and mode) survives Reset.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/controller.h"
#include "app/run_history.h"

namespace kvscope::app {

struct TokenInfo {
  int32_t id = 0;
  std::string text;
  bool prompt = false;
  int step = 0;  // step that sampled it (0 for prompt tokens)
};

class Timeline {
 public:
  // Applies one controller event (Reset clears; Step appends). Returns false for events
  // of an older run, which are ignored.
  bool apply(const Event& e);
  void clear();

  const std::vector<std::shared_ptr<const StepTrace>>& steps() const { return steps_; }
  const StepTrace* last() const { return steps_.empty() ? nullptr : steps_.back().get(); }
  const std::vector<TokenInfo>& tokens() const { return tokens_; }
  int n_layer() const { return n_layer_; }
  uint64_t run() const { return run_; }
  const std::string& prompt_text() const { return prompt_text_; }
  bool prompt_chat() const { return prompt_chat_; }
  const RunHistory& history() const { return history_; }
  // This run's series and the other mode's last series for the same prompt (nullptr when
  // that mode has not run on it, or when it is this very run).
  const RunSeries* current_series() const;
  const RunSeries* other_series() const;
  // True between a Reset/Step of this run and its Finished/Error event.
  bool finished() const { return finished_; }
  CacheMode mode() const { return mode_; }
  const std::string& generated_text() const { return generated_; }

  // L2 norm of layer `layer`'s K (or V) row at `pos`; NaN when not written yet.
  float kv_norm(int pos, int layer, bool v) const;
  // Smallest/largest norm seen in a layer (for color scaling).
  float kv_norm_min(int layer, bool v) const;
  float kv_norm_max(int layer, bool v) const;

 private:
  void ensure_layers(int n);
  uint64_t run_ = 0;
  std::string prompt_text_, generated_;
  CacheMode mode_ = CacheMode::Cache;
  bool prompt_chat_ = false, finished_ = true;
  RunHistory history_;
  std::vector<std::shared_ptr<const StepTrace>> steps_;
  std::vector<TokenInfo> tokens_;
  int n_layer_ = 0;
  std::vector<std::vector<float>> k_norm_, v_norm_;   // [L][pos]
  std::vector<float> k_min_, k_max_, v_min_, v_max_;  // [L]
};

}  // namespace kvscope::app
