// controller_compare.cpp — compare modes on the controller's worker: the same prompt with
// and without the KV cache, one run after the other or interleaved step by step on a twin
// source, each token checked against the other run's (see CmdCompare in controller.h).
#include <chrono>
#include <string>

#include "app/core/controller.h"

namespace kvscope::app {

namespace {
using Clock = std::chrono::steady_clock;
double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}
}  // namespace

void Controller::start_compare(CmdCompare& c) {
  cancel_compare();
  if (!source_ || source_->is_replay()) {
    emit_error(ErrorOrigin::Reset, source_ ? "compare modes needs the model, not a recording"
                                           : "compare modes needs a model: open one first");
    return;
  }
  compare_.active = true;
  compare_.prompt = c.prompt;
  compare_.steps = std::max(1, c.steps);
  compare_.phase = c.interleaved ? 3 : 1;
  compare_.user_mode = source_->mode();
  compare_.user_max_tokens = source_->max_tokens();
  compare_.twin_steps = 0;
  set_mode(CacheMode::Cache, ErrorOrigin::Mode);
  (void)source_->set_max_tokens(compare_.steps);
  if (c.interleaved) {
    auto twin = source_->twin(CacheMode::NoCache);
    Status st = twin.ok() ? twin.value()->set_max_tokens(compare_.steps) : twin.error();
    if (st.ok()) st = twin.value()->reset(compare_.prompt);
    if (!st.ok()) {
      emit_error(ErrorOrigin::Reset, "compare modes (interleaved): " + st.message());
      cancel_compare();
      return;
    }
    compare_.twin = std::move(twin.value());
  }
  if (!start_run(compare_.prompt, true, compare_.phase)) cancel_compare();
}

bool Controller::check_compare_token(int step, int32_t token, CacheMode mode) {
  const auto& ref = compare_.tokens;
  if (step >= 1 && size_t(step) <= ref.size() && ref[size_t(step) - 1] == token) return true;
  std::string cached =
      step >= 1 && size_t(step) <= ref.size() ? std::to_string(ref[size_t(step) - 1]) : "none";
  emit_error(ErrorOrigin::Step,
             "compare modes: at step " + std::to_string(step) + " KV CACHE sampled token " +
                 cached + " and " + (mode == CacheMode::NoCache ? "NO CACHE" : "KV CACHE") +
                 " token " + std::to_string(token) + "; the two modes must give the same tokens");
  finish_run("error");
  return false;
}

void Controller::do_twin_step() {
  a_busy_since_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  a_busy_ = true;
  Expected<StepTrace> tr = compare_.twin->step();
  a_busy_ = false;
  if (!tr.ok()) {
    emit_error(ErrorOrigin::Step, "compare modes, NO CACHE run: " + tr.error().message);
    finish_run("error");
    return;
  }
  ++compare_.twin_steps;
  if (!check_compare_token(tr->step, tr->token_id, CacheMode::NoCache)) return;
  StepTrace& t = tr.value();
  // Its counters and timings are what the compare plot needs; the per-position arrays stay
  // out (the KV CACHE run's step shows the same attention).
  t.attention = std::vector<float>();
  t.k_norm = std::vector<float>();
  t.v_norm = std::vector<float>();
  t.prompt = std::vector<PromptToken>();
  Event e{Event::Kind::CompareStep, run_};
  e.done_s = now_s();
  e.trace = std::make_shared<const StepTrace>(std::move(t));
  emit(std::move(e));
  const bool cache_done = source_->done(), nocache_done = compare_.twin->done();
  if (cache_done != nocache_done ||
      (cache_done && source_->stop_reason() != compare_.twin->stop_reason())) {
    emit_error(
        ErrorOrigin::Step,
        "compare modes: after step " + std::to_string(compare_.twin_steps) + " KV CACHE " +
            (cache_done ? "stopped (" + source_->stop_reason() + ")" : std::string("goes on")) +
            " and NO CACHE " +
            (nocache_done ? "stopped (" + compare_.twin->stop_reason() + ")"
                          : std::string("goes on")) +
            "; the two modes must agree");
    finish_run("error");
    return;
  }
  if (cache_done) finish_run(source_->stop_reason());
}

void Controller::cancel_compare() {
  if (!compare_.active) return;
  compare_.active = false;
  compare_.twin.reset();
  std::vector<int32_t>().swap(compare_.tokens);
  if (!source_) return;
  set_mode(compare_.user_mode, ErrorOrigin::Mode);
  (void)source_->set_max_tokens(compare_.user_max_tokens);
}

}  // namespace kvscope::app
