// run_history.h — measured per-step series of earlier runs, kept per prompt and mode.
//
// For every prompt (text + chat flag) and every cache mode, the last run that took at
// least one step in that mode keeps its per-step wall time (ms), FLOPs, K/V rows and
// SEQ_LEN, exactly as the StepTraces reported them. A run is filed under the mode of its first step; a run
// that switched modes mid-run keeps each step's own mode so its curve can be colored
// per segment. Nothing here is estimated: a series exists only if the run happened.
// Owned by the UI thread (inside Timeline); survives resets.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/session.h"

namespace kvscope::app {

struct RunSeries {
  uint64_t run = 0;          // controller run id that produced it
  CacheMode mode = CacheMode::Cache;  // mode of the run's first step
  std::vector<double> ms;              // [steps] wall (or device) ms of each step
  std::vector<double> flops;           // [steps] FLOPs of each step
  std::vector<uint64_t> kv_rows;       // [steps] K/V rows computed by each step (T x L)
  std::vector<int> seq_len;            // [steps] SEQ_LEN after each step
  int prompt_len = 0;                  // p: tokens of the prompt (SEQ_LEN before step 1)
  std::vector<CacheMode> step_mode;    // [steps] mode each step ran in
  bool finished = false;               // the run ended (eos, max tokens, stop)
  bool mixed() const;                  // some step ran in another mode than `mode`
  size_t steps() const { return ms.size(); }
};

class RunHistory {
 public:
  // Appends one step of run `run` of prompt (text, chat). The first step of a new run in a
  // mode replaces that mode's previous series for the prompt.
  void record(const std::string& text, bool chat, uint64_t run, const StepTrace& t);
  // Marks run `run` of the prompt finished (its series stays).
  void finish(const std::string& text, bool chat, uint64_t run);
  // The series of `mode` for the prompt, or nullptr if that mode never ran on it.
  const RunSeries* find(const std::string& text, bool chat, CacheMode mode) const;
  void clear() { runs_.clear(); }

 private:
  using Key = std::pair<std::string, bool>;
  struct Slot {
    RunSeries by_mode[2];
    bool has[2] = {false, false};
  };
  std::map<Key, Slot> runs_;
};

}  // namespace kvscope::app
