// run_driver.cpp — see run_driver.h.
#include "app/core/run_driver.h"

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

Expected<RunEnd> drive_interleaved(StepSource& cache, const PromptSpec& prompt,
                                   const DriveOptions& opts) {
  KV_TRY(cache.set_mode(CacheMode::Cache));
  auto twin = cache.twin(CacheMode::NoCache);
  if (!twin.ok()) return twin.error();
  StepSource& nocache = *twin.value();
  KV_TRY(cache.reset(prompt));
  KV_TRY(nocache.reset(prompt));
  const uint64_t run = opts.timeline ? opts.timeline->run() + 1 : 1;
  Event reset{Event::Kind::Reset, run};
  reset.prompt_text = cache.prompt().text;
  reset.prompt_chat = cache.prompt().chat;
  reset.mode = CacheMode::Cache;
  reset.compare = 3;
  reset.store = opts.record;
  if (opts.timeline) opts.timeline->apply(reset);
  auto now_s = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  RunEnd end;
  end.reason = "running";
  for (int i = 0; i < opts.steps && !cache.done(); ++i) {
    auto c = cache.step();
    if (!c.ok()) return c.error();
    auto n = nocache.step();
    if (!n.ok()) return n.error();
    if (c->token_id != n->token_id)
      return make_error("compare modes: at step ", c->step, " KV CACHE sampled token ", c->token_id,
                        " and NO CACHE token ", n->token_id,
                        "; the two modes must give the same tokens");
    if (cache.done() != nocache.done())
      return make_error("compare modes: after step ", c->step, " one mode stopped (",
                        cache.done() ? cache.stop_reason() : nocache.stop_reason(),
                        ") and the other goes on; the two modes must agree");
    ++end.steps;
    Event e{Event::Kind::Step, run};
    e.done_s = now_s();
    if (opts.record) {
      auto off = opts.record->append_step(c.value());
      if (!off.ok()) return off.error();
      e.offset = off.value();
    }
    e.trace = std::make_shared<const StepTrace>(std::move(c.value()));
    if (opts.on_step) opts.on_step(*e.trace);
    if (opts.timeline) opts.timeline->apply(e);
    StepTrace& t = n.value();
    t.attention = std::vector<float>();
    t.k_norm = std::vector<float>();
    t.v_norm = std::vector<float>();
    t.prompt = std::vector<PromptToken>();
    Event ne{Event::Kind::CompareStep, run};
    ne.done_s = now_s();
    ne.trace = std::make_shared<const StepTrace>(std::move(t));
    if (opts.timeline) opts.timeline->apply(ne);
  }
  if (cache.done()) end.reason = cache.stop_reason();
  if (opts.record) KV_TRY(opts.record->finish(end));
  if (opts.timeline && cache.done()) {
    Event f{Event::Kind::Finished, run};
    f.reason = end.reason;
    opts.timeline->apply(f);
  }
  return end;
}

}  // namespace kvscope::app
