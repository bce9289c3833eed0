// run_driver.cpp — see run_driver.h.
#include "app/core/run_driver.h"

#include <string>
#include <utility>

#include "app/core/clock.h"
#include "app/core/compare_run.h"

namespace kvscope::app {

namespace {

// Runs `src` on the calling thread, one run after another, as the controller's worker would:
// the same events, in the same order; the host of a CompareRun.
class Driver final : public CompareHost {
 public:
  Driver(StepSource& src, const DriveOptions& opts)
      : src_(src),
        opts_(opts),
        record_(opts.record),
        run_(opts.timeline ? opts.timeline->run() : 0) {}

  Status start(const PromptSpec& prompt, ComparePhase phase);
  Status step();           // one step of `src`; ends the run when it is done
  Status close_running();  // the run reached opts.steps and could go on: END Running
  bool finished() const { return finished_; }
  const RunEnd& end() const { return end_; }
  Status failure() const { return failed_; }
  CompareRun compare{*this};

  StepSource* compare_source() override { return &src_; }
  bool compare_start(const PromptSpec& prompt, ComparePhase phase) override;
  void compare_set_mode(CacheMode mode) override;
  void compare_error(ErrorOrigin origin, std::string message) override;
  void compare_finish(FinishReason reason) override;
  void compare_twin_step(StepTrace trace) override;

 private:
  void emit(const Event& e) {
    if (opts_.timeline) opts_.timeline->apply(e);
    if (opts_.on_event) opts_.on_event(e);
  }
  void fail(Status st) {
    if (failed_.ok()) failed_ = std::move(st);
  }

  StepSource& src_;
  const DriveOptions& opts_;
  std::shared_ptr<RunFile> record_;
  uint64_t run_;
  RunEnd end_;
  bool finished_ = true;
  Status failed_;
};

Status Driver::start(const PromptSpec& prompt, ComparePhase phase) {
  KV_TRY(src_.reset(prompt));
  if (phase == ComparePhase::NoCacheLeg)
    record_ = opts_.next_record ? opts_.next_record() : nullptr;
  ++run_;
  end_ = RunEnd{0, to_string(FinishReason::Running)};
  finished_ = false;
  Event reset{Event::Kind::Reset, run_};
  reset.prompt_text = src_.prompt().text;
  reset.prompt_chat = src_.prompt().chat;
  reset.mode = src_.mode();
  reset.compare = phase;
  reset.store = src_.is_replay() ? src_.recording() : record_;
  emit(reset);
  return {};
}

Status Driver::step() {
  auto tr = src_.step();
  if (!tr.ok()) return tr.error();
  ++end_.steps;
  Event e{Event::Kind::Step, run_};
  e.done_s = now_s();
  if (src_.is_replay()) {
    e.offset = src_.step_offset(tr->step);
  } else if (record_) {
    auto off = record_->append_step(tr.value());
    if (!off.ok()) return off.error();
    e.offset = off.value();
  }
  const int step = tr->step;
  const int32_t token = tr->token_id;
  e.trace = std::make_shared<const StepTrace>(std::move(tr.value()));
  if (opts_.on_step) opts_.on_step(*e.trace);
  emit(e);
  if (!compare.after_step(step, token)) return {};
  // Interleaved, the run ends after the NO CACHE step that goes with this one.
  if (src_.done() && !compare.ends_runs()) compare_finish(src_.stop_reason());
  return {};
}

Status Driver::close_running() {
  finished_ = true;
  if (record_ && !src_.is_replay()) KV_TRY(record_->finish(end_));
  return {};
}

bool Driver::compare_start(const PromptSpec& prompt, ComparePhase phase) {
  Status st = start(prompt, phase);
  if (!st.ok()) fail(st);
  return st.ok();
}

void Driver::compare_set_mode(CacheMode mode) {
  if (src_.mode() == mode) return;
  if (Status st = src_.set_mode(mode); !st.ok()) return fail(st);
  Event e{Event::Kind::ModeChanged, run_};
  e.mode = src_.mode();
  emit(e);
}

void Driver::compare_error(ErrorOrigin origin, std::string message) {
  Event e{Event::Kind::Error, run_};
  e.origin = origin;
  e.mode = src_.mode();
  e.error = message;
  if (opts_.on_event) opts_.on_event(e);
  fail(make_error(message));
}

void Driver::compare_finish(FinishReason reason) {
  if (finished_) return;
  end_.reason = to_string(reason);
  finished_ = true;
  if (record_ && !src_.is_replay())
    if (Status st = record_->finish(end_); !st.ok()) fail(st);
  Event f{Event::Kind::Finished, run_};
  f.reason = reason;
  emit(f);
  compare.finished(reason, end_.steps);
}

void Driver::compare_twin_step(StepTrace trace) {
  Event e{Event::Kind::CompareStep, run_};
  e.done_s = now_s();
  e.trace = std::make_shared<const StepTrace>(std::move(trace));
  emit(e);
}

}  // namespace

Expected<RunEnd> drive_run(StepSource& src, const PromptSpec& prompt, const DriveOptions& opts) {
  Driver d(src, opts);
  KV_TRY(d.start(prompt, ComparePhase::None));
  for (int i = 0; i < opts.steps && !d.finished(); ++i) KV_TRY(d.step());
  if (!d.finished()) KV_TRY(d.close_running());
  KV_TRY(d.failure());
  return d.end();
}

Expected<RunEnd> drive_compare(StepSource& src, const PromptSpec& prompt, bool interleaved,
                               const DriveOptions& opts) {
  Driver d(src, opts);
  if (!d.compare.begin(prompt, opts.steps, interleaved)) {
    KV_TRY(d.failure());
    return make_error("compare modes could not start");
  }
  // Each run stops at opts.steps (its token limit); the bound only guards a source that
  // would not.
  for (int i = 0; d.compare.active() && i < 2 * opts.steps + 2; ++i) {
    if (d.compare.twin_due(d.end().steps)) {
      d.compare.step_twin();
    } else if (Status st = d.step(); !st.ok()) {
      d.compare.cancel();
      return st.error();
    }
  }
  d.compare.cancel();
  KV_TRY(d.failure());
  return d.end();
}

}  // namespace kvscope::app
