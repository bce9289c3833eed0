// run_driver.cpp — see run_driver.h.
#include "app/run_driver.h"

#include <chrono>

namespace kvscope::app {

Expected<RunEnd> drive_run(StepSource& src, const PromptSpec& prompt, const DriveOptions& opts) {
  KV_TRY(src.reset(prompt));
  const uint64_t run = opts.timeline ? opts.timeline->run() + 1 : 1;
  Event reset{Event::Kind::Reset, run};
  reset.prompt_text = src.prompt().text;
  reset.prompt_chat = src.prompt().chat;
  reset.mode = src.mode();
  reset.store = src.is_replay() ? src.recording() : opts.record;
  if (opts.timeline) opts.timeline->apply(reset);
  RunEnd end;
  end.reason = "running";
  for (int i = 0; i < opts.steps && !src.done(); ++i) {
    auto tr = src.step();
    if (!tr.ok()) return tr.error();
    ++end.steps;
    Event e{Event::Kind::Step, run};
    e.done_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    if (src.is_replay()) {
      e.offset = src.step_offset(tr->step);
    } else if (opts.record) {
      auto off = opts.record->append_step(tr.value());
      if (!off.ok()) return off.error();
      e.offset = off.value();
    }
    e.trace = std::make_shared<const StepTrace>(std::move(tr.value()));
    if (opts.on_step) opts.on_step(*e.trace);
    if (opts.timeline) opts.timeline->apply(e);
  }
  if (src.done()) end.reason = src.stop_reason();
  if (opts.record && !src.is_replay()) KV_TRY(opts.record->finish(end));
  if (opts.timeline && src.done()) {
    Event f{Event::Kind::Finished, run};
    f.reason = end.reason;
    opts.timeline->apply(f);
  }
  return end;
}

}  // namespace kvscope::app
