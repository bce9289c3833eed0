// compare_run.h — compare modes, once: the same prompt run with and without the KV cache,
// each token checked against the other run's (see CmdCompare in controller.h).
//
// A CompareRun owns what a comparison is: its phases (the KV CACHE leg, then the NO CACHE
// leg; or both interleaved step by step on a twin source), the tokens one run must repeat,
// the checks, and the person's mode and token limit to restore. What it runs on is its
// host's: the controller's worker (the app) and drive_compare (headless capture, tests)
// are both hosts, so a screenshot of compare modes goes through the code the app runs.
//
// The host steps its own source and, after each step, hands the step to after_step(); it
// asks twin_due() whether the NO CACHE twin steps next, and tells finished() whenever one of
// its runs ends (also on Stop and errors). The CompareRun calls back through CompareHost to
// start a leg, switch modes, report an error, end a run or pass on a NO CACHE step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/core/step_source.h"

namespace kvscope::app {

// Where a comparison stands. The values are those the UI and tests have always seen
// (0 none, 1 and 2 the legs one after the other, 3 both interleaved).
enum class ComparePhase : int { None = 0, CacheLeg = 1, NoCacheLeg = 2, Interleaved = 3 };
const char* to_string(ComparePhase p);  // "none", "cache", "nocache", "interleaved"

// What an Error event is about (the UI and the timeline act on it differently).
enum class ErrorOrigin { Reset, Step, Mode, Settings, Model, Save, History };

// What a CompareRun needs from whoever runs it (see the file comment).
class CompareHost {
 public:
  virtual ~CompareHost() = default;
  virtual StepSource* compare_source() = 0;  // the source the KV CACHE run is on (or null)
  // Resets the source with `prompt` and starts a run of `phase` that plays as fast as the
  // engine goes. False (the error reported) when the source refused the prompt.
  virtual bool compare_start(const PromptSpec& prompt, ComparePhase phase) = 0;
  virtual void compare_set_mode(CacheMode mode) = 0;  // the source's mode, and say so
  virtual void compare_error(ErrorOrigin origin, std::string message) = 0;
  // Ends the current run with `reason` (then calls CompareRun::finished, as for any run).
  virtual void compare_finish(FinishReason reason) = 0;
  // A NO CACHE step of an interleaved comparison (per-position arrays left out).
  virtual void compare_twin_step(StepTrace trace) = 0;
};

class CompareRun {
 public:
  explicit CompareRun(CompareHost& host) : host_(host) {}
  ~CompareRun() = default;
  CompareRun(const CompareRun&) = delete;
  CompareRun& operator=(const CompareRun&) = delete;

  // Cancels any comparison and starts one: `steps` steps of each run. False when it could
  // not start (the error reported; the person's settings restored).
  bool begin(const PromptSpec& prompt, int steps, bool interleaved);
  // Ends the comparison where it stands and restores the person's mode and token limit.
  void cancel();

  bool active() const { return phase_ != ComparePhase::None; }
  ComparePhase phase() const { return phase_; }
  StepSource* twin() { return twin_.get(); }  // interleaved: the NO CACHE run
  // The next step is the twin's: it catches up after each KV CACHE step (`steps` so far).
  bool twin_due(int steps) const { return twin_ && twin_steps_ < steps; }
  // Interleaved, the run ends after the NO CACHE step, not when the host's source is done.
  bool ends_runs() const { return twin_ != nullptr; }

  // The host's source made step `step`, sampling `token`: kept (KV CACHE) or checked
  // (NO CACHE). False when it differs: the comparison has ended with an error.
  bool after_step(int step, int32_t token);
  // Steps the twin, checks it against the KV CACHE run and passes it on; ends the run when
  // both are done (or with an error when they disagree).
  void step_twin();
  // A run ended (`steps` steps, `reason`): the KV CACHE leg moves on to the NO CACHE leg
  // when it ended by itself; anything else ends the comparison.
  void finished(FinishReason reason, int steps);

 private:
  bool check_token(int step, int32_t token);
  bool check_twin_done();
  bool start_twin();

  CompareHost& host_;
  ComparePhase phase_ = ComparePhase::None;
  PromptSpec prompt_;
  int steps_ = 0;
  CacheMode user_mode_ = CacheMode::Cache;
  int user_max_tokens_ = 0;
  std::vector<int32_t> tokens_;       // the KV CACHE run's tokens, to check the other's
  std::unique_ptr<StepSource> twin_;  // interleaved: the NO CACHE run
  int twin_steps_ = 0;                // interleaved: NO CACHE steps done
};

}  // namespace kvscope::app
