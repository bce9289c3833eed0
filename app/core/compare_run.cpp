// compare_run.cpp — see compare_run.h.
#include "app/core/compare_run.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvscope::app {

const char* to_string(ComparePhase p) {
  switch (p) {
    case ComparePhase::None:
      return "none";
    case ComparePhase::CacheLeg:
      return "cache";
    case ComparePhase::NoCacheLeg:
      return "nocache";
    case ComparePhase::Interleaved:
      return "interleaved";
  }
  return "none";
}

bool CompareRun::begin(const PromptSpec& prompt, int steps, bool interleaved) {
  cancel();
  StepSource* src = host_.compare_source();
  if (!src || src->is_replay()) {
    host_.compare_error(ErrorOrigin::Reset, src ? "compare modes needs the model, not a recording"
                                                : "compare modes needs a model: open one first");
    return false;
  }
  phase_ = interleaved ? ComparePhase::Interleaved : ComparePhase::CacheLeg;
  prompt_ = prompt;
  steps_ = std::max(1, steps);
  user_mode_ = src->mode();
  user_max_tokens_ = src->max_tokens();
  twin_steps_ = 0;
  host_.compare_set_mode(CacheMode::Cache);
  (void)src->set_max_tokens(steps_);
  if (interleaved && !start_twin()) return false;
  if (!host_.compare_start(prompt_, phase_)) {
    cancel();
    return false;
  }
  return true;
}

bool CompareRun::start_twin() {
  auto twin = host_.compare_source()->twin(CacheMode::NoCache);
  Status st = twin.ok() ? twin.value()->set_max_tokens(steps_) : twin.error();
  if (st.ok()) st = twin.value()->reset(prompt_);
  if (!st.ok()) {
    host_.compare_error(ErrorOrigin::Reset, "compare modes (interleaved): " + st.message());
    cancel();
    return false;
  }
  twin_ = std::move(twin.value());
  return true;
}

void CompareRun::cancel() {
  if (!active()) return;
  phase_ = ComparePhase::None;
  twin_.reset();
  std::vector<int32_t>().swap(tokens_);
  StepSource* src = host_.compare_source();
  if (!src) return;
  host_.compare_set_mode(user_mode_);
  (void)src->set_max_tokens(user_max_tokens_);
}

bool CompareRun::after_step(int step, int32_t token) {
  if (!active()) return true;
  if (phase_ != ComparePhase::NoCacheLeg) {
    tokens_.push_back(token);
    return true;
  }
  return check_token(step, token);
}

bool CompareRun::check_token(int step, int32_t token) {
  const auto& ref = tokens_;
  if (step >= 1 && size_t(step) <= ref.size() && ref[size_t(step) - 1] == token) return true;
  std::string cached =
      step >= 1 && size_t(step) <= ref.size() ? std::to_string(ref[size_t(step) - 1]) : "none";
  host_.compare_error(ErrorOrigin::Step, "compare modes: at step " + std::to_string(step) +
                                             " KV CACHE sampled token " + cached +
                                             " and NO CACHE token " + std::to_string(token) +
                                             "; the two modes must give the same tokens");
  host_.compare_finish(FinishReason::Error);
  return false;
}

void CompareRun::step_twin() {
  Expected<StepTrace> tr = twin_->step();
  if (!tr.ok()) {
    host_.compare_error(ErrorOrigin::Step, "compare modes, NO CACHE run: " + tr.error().message);
    host_.compare_finish(FinishReason::Error);
    return;
  }
  ++twin_steps_;
  if (!check_token(tr->step, tr->token_id)) return;
  StepTrace& t = tr.value();
  // Its counters and timings are what the compare plot needs; the per-position arrays stay
  // out (the KV CACHE run's step shows the same attention).
  t.attention = std::vector<float>();
  t.k_norm = std::vector<float>();
  t.v_norm = std::vector<float>();
  t.prompt = std::vector<PromptToken>();
  host_.compare_twin_step(std::move(t));
  if (!check_twin_done()) return;
  if (StepSource* src = host_.compare_source(); src->done())
    host_.compare_finish(src->stop_reason());
}

// Both runs of an interleaved comparison stop together, for the same reason.
bool CompareRun::check_twin_done() {
  const StepSource& cache = *host_.compare_source();
  const bool cache_done = cache.done(), nocache_done = twin_->done();
  if (cache_done == nocache_done && (!cache_done || cache.stop_reason() == twin_->stop_reason()))
    return true;
  host_.compare_error(
      ErrorOrigin::Step,
      "compare modes: after step " + std::to_string(twin_steps_) + " KV CACHE " +
          (cache_done ? std::string("stopped (") + to_string(cache.stop_reason()) + ")"
                      : std::string("goes on")) +
          " and NO CACHE " +
          (nocache_done ? std::string("stopped (") + to_string(twin_->stop_reason()) + ")"
                        : std::string("goes on")) +
          "; the two modes must agree");
  host_.compare_finish(FinishReason::Error);
  return false;
}

void CompareRun::finished(FinishReason reason, int steps) {
  if (!active()) return;
  if (phase_ == ComparePhase::NoCacheLeg && ended_by_itself(reason) &&
      size_t(steps) != tokens_.size()) {
    host_.compare_error(ErrorOrigin::Step,
                        "compare modes: the NO CACHE run ended after " + std::to_string(steps) +
                            " steps, the KV CACHE run after " + std::to_string(tokens_.size()) +
                            "; the two modes must agree");
  }
  if (phase_ == ComparePhase::CacheLeg && ended_by_itself(reason)) {
    phase_ = ComparePhase::NoCacheLeg;
    host_.compare_set_mode(CacheMode::NoCache);
    if (!host_.compare_start(prompt_, ComparePhase::NoCacheLeg)) cancel();
  } else {
    cancel();
  }
}

}  // namespace kvscope::app
