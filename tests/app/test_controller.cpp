// test_controller.cpp — the controller's worker thread driven like the UI drives it:
// play, mode toggle mid-run, prompt switch mid-step, pause/step, reset, shutdown.
// Asserts the order of what arrives (no window; runs under ThreadSanitizer too).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "app/controller.h"
#include "app/engine_setup.h"
#include "app/timeline.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

std::unique_ptr<Controller> make_controller(int max_tokens = 64) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) return nullptr;
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  // One engine thread: this test is about the controller's threads; the CPU backend's
  // own pool is covered by the engine tests (and is invisible to TSan unless the engine
  // itself is built with -fsanitize=thread).
  eo.threads = 1;
  eo.max_tokens = max_tokens;
  auto eng = open_engine(eo);
  EXPECT_TRUE(eng.ok()) << (eng.ok() ? "" : eng.error().message);
  if (!eng.ok()) return nullptr;
  return std::make_unique<Controller>(std::move(eng.value().session));
}

// Collects events until `pred(all events so far)` holds or `seconds` pass.
template <class Pred>
std::vector<Event> collect(Controller& c, std::vector<Event>& all, Pred pred, double seconds = 30) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred(all) && std::chrono::steady_clock::now() < until)
    for (Event& e : c.wait_events(50)) all.push_back(std::move(e));
  return all;
}

int count_steps(const std::vector<Event>& ev, uint64_t run) {
  int n = 0;
  for (const Event& e : ev) n += e.kind == Event::Kind::Step && e.run == run;
  return n;
}

const PromptSpec kStory{"Once upon a time, in a kingdom far away,", false};
const PromptSpec kCode{"def add(a, b):\n    return", false};

}  // namespace

TEST(Controller, PlayToggleModeSwitchPromptAndShutdownInOrder) {
  auto ctl = make_controller();
  if (!ctl) GTEST_SKIP() << "default model not found: " << KVSCOPE_DEFAULT_MODEL;
  std::vector<Event> ev;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, /*autoplay=*/true});
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 1) >= 3; });
  ASSERT_GE(count_steps(ev, 1), 3);

  ctl->send(CmdMode{CacheMode::NoCache});
  collect(*ctl, ev, [](auto& e) {
    int after = 0;
    bool seen = false;
    for (auto& x : e) {
      seen |= x.kind == Event::Kind::ModeChanged;
      after += seen && x.kind == Event::Kind::Step;
    }
    return after >= 2;
  });
  // Prompt switch while steps are running (likely mid-step): the old run's traces
  // all come before the new run's Reset, and the new run starts at step 1.
  ctl->send(CmdReset{kCode, /*autoplay=*/true});
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 2) >= 2; });
  ctl->send(CmdPause{});
  ctl.reset();  // shutdown: joins after the step in flight

  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.front().kind, Event::Kind::Reset);
  EXPECT_EQ(ev.front().run, 1u);
  uint64_t run = 0;
  int expect_step = 1;
  CacheMode mode = CacheMode::Cache;
  bool saw_mode_change = false, saw_run2 = false;
  for (const Event& e : ev) {
    ASSERT_GE(e.run, run) << "events of an older run arrived after a newer one";
    if (e.kind == Event::Kind::Reset) {
      EXPECT_EQ(e.run, run + 1);
      run = e.run;
      expect_step = 1;
      saw_run2 |= run == 2;
      EXPECT_EQ(e.prompt_text, run == 1 ? kStory.text : kCode.text);
      continue;
    }
    ASSERT_EQ(e.run, run);
    if (e.kind == Event::Kind::ModeChanged) {
      mode = e.mode;
      saw_mode_change = true;
      EXPECT_EQ(mode, CacheMode::NoCache);
    }
    if (e.kind == Event::Kind::Step) {
      ASSERT_TRUE(e.trace);
      EXPECT_EQ(e.trace->step, expect_step++) << "run " << run;
      EXPECT_EQ(e.trace->mode, mode) << "a trace after the mode toggle ran in the old mode";
      if (mode == CacheMode::NoCache) {
        EXPECT_EQ(e.trace->kv_bytes, 0u);
      }
    }
    EXPECT_NE(e.kind, Event::Kind::Error) << e.error;
  }
  EXPECT_TRUE(saw_mode_change);
  EXPECT_TRUE(saw_run2);
}

TEST(Controller, PauseStopsStepsAndStepRunsExactlyOne) {
  auto ctl = make_controller();
  if (!ctl) GTEST_SKIP() << "default model not found";
  std::vector<Event> ev;
  ctl->send(CmdReset{kStory, false});
  collect(*ctl, ev, [](auto& e) { return !e.empty(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), 0) << "a reset without autoplay must not step";

  ctl->send(CmdStep{});
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 1) >= 1; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), 1);
  EXPECT_FALSE(ctl->state().playing);

  // Slow playback is paced: at 2 tok/s, about one step per half second.
  ctl->send(CmdSpeed{2.0f});
  ctl->send(CmdPlay{});
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  ctl->send(CmdPause{});
  // A step already running when Pause arrives still completes (it can be slow under a
  // sanitizer): wait until the worker is idle, then count.
  auto wait_idle = [&] {
    for (int i = 0; i < 600; ++i) {
      ControllerState st = ctl->state();
      if (!st.playing && !st.busy) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  };
  wait_idle();
  int n = count_steps(ev, 1);
  EXPECT_GE(n, 2);  // the Step above plus at least one paced step
  EXPECT_LE(n, 5);  // unpaced, 1.2 s would hold many more steps
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), n) << "steps arrived after Pause";

  ctl->send(CmdStop{});
  ctl->send(CmdStep{});  // ignored: the run is finished
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  wait_idle();
  EXPECT_EQ(count_steps(ev, 1), n);
  EXPECT_EQ(ev.back().kind, Event::Kind::Finished);
  EXPECT_TRUE(ctl->state().finished);
}

TEST(Controller, MaxTokensFinishesTheRunAndTimelineFollows) {
  auto ctl = make_controller(/*max_tokens=*/4);
  if (!ctl) GTEST_SKIP() << "default model not found";
  std::vector<Event> ev;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return !e.empty() && e.back().kind == Event::Kind::Finished; });
  ASSERT_EQ(ev.back().kind, Event::Kind::Finished);
  EXPECT_EQ(count_steps(ev, 1), 4);
  Timeline tl;
  for (const Event& e : ev) tl.apply(e);
  ASSERT_TRUE(tl.last());
  EXPECT_EQ(tl.last()->stop, StopReason::MaxTokens);
  EXPECT_EQ(int(tl.tokens().size()), tl.last()->seq_len);
  // Every position before the newest token has K/V norms for every layer.
  for (int p = 0; p + 1 < int(tl.tokens().size()); ++p)
    for (int l = 0; l < tl.n_layer(); ++l)
      EXPECT_FALSE(std::isnan(tl.kv_norm(p, l, false))) << p << "," << l;
  // An event from an older run is ignored.
  Event stale{Event::Kind::Step, 0};
  EXPECT_FALSE(tl.apply(stale));
}

TEST(Controller, BadPromptIsAnErrorEventNotACrash) {
  auto ctl = make_controller();
  if (!ctl) GTEST_SKIP() << "default model not found";
  std::vector<Event> ev;
  ctl->send(CmdReset{PromptSpec{"", false}, true});
  collect(
      *ctl, ev, [](auto& e) { return !e.empty(); }, 10);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.front().kind, Event::Kind::Error);
  EXPECT_FALSE(ev.front().error.empty());
  EXPECT_FALSE(ctl->state().playing);
}

// The plots' comparison rule: the other mode's measured curve exists only after that
// mode really ran on the same prompt; both series are the steps each run took.
TEST(Controller, SamePromptInBothModesKeepsBothMeasuredSeries) {
  const int kSteps = 6;
  auto ctl = make_controller(kSteps);
  if (!ctl) GTEST_SKIP() << "default model not found";
  std::vector<Event> ev;
  Timeline tl;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return !e.empty() && e.back().kind == Event::Kind::Finished; });
  ASSERT_EQ(ev.back().kind, Event::Kind::Finished);
  for (const Event& e : ev) tl.apply(e);
  int cache_steps = count_steps(ev, 1);
  ASSERT_EQ(cache_steps, kSteps);
  // Only one mode has run on this prompt: nothing to overlay.
  ASSERT_TRUE(tl.current_series());
  EXPECT_EQ(tl.other_series(), nullptr);

  ev.clear();
  ctl->send(CmdMode{CacheMode::NoCache});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return !e.empty() && e.back().kind == Event::Kind::Finished; });
  ASSERT_EQ(ev.back().kind, Event::Kind::Finished);
  for (const Event& e : ev) tl.apply(e);
  int nocache_steps = count_steps(ev, 2);
  ASSERT_EQ(nocache_steps, kSteps);

  const RunSeries* c = tl.history().find(kStory.text, kStory.chat, CacheMode::Cache);
  const RunSeries* n = tl.history().find(kStory.text, kStory.chat, CacheMode::NoCache);
  ASSERT_TRUE(c && n);
  EXPECT_EQ(tl.current_series(), n);
  EXPECT_EQ(tl.other_series(), c);
  EXPECT_EQ(int(c->flops.size()), cache_steps);
  EXPECT_EQ(int(c->ms.size()), cache_steps);
  EXPECT_EQ(int(n->flops.size()), nocache_steps);
  EXPECT_EQ(int(n->ms.size()), nocache_steps);
  EXPECT_TRUE(c->finished && n->finished);
  EXPECT_FALSE(c->mixed() || n->mixed());
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_GT(c->ms[size_t(i)], 0.0);
    EXPECT_GT(n->ms[size_t(i)], 0.0);
  }
  // Step 1 is the same prefill in both modes; afterwards NO_CACHE redoes the whole sequence.
  EXPECT_NEAR(n->flops[0], c->flops[0], 1e-6 * c->flops[0]);
  for (int i = 1; i < kSteps; ++i)
    EXPECT_GT(n->flops[size_t(i)], c->flops[size_t(i)]) << "step " << i + 1;
  // The series are the traces' own numbers.
  EXPECT_EQ(n->flops.back(), double(tl.last()->flops));
  // Another prompt (or the chat flag) has no history of its own.
  EXPECT_EQ(tl.history().find(kStory.text, true, CacheMode::Cache), nullptr);
  EXPECT_EQ(tl.history().find(kCode.text, false, CacheMode::Cache), nullptr);
}

TEST(RunHistory, MixedRunKeepsEachStepsModeAndNewRunReplacesOld) {
  RunHistory h;
  StepTrace t;
  t.mode = CacheMode::Cache;
  t.flops = 100;
  t.ms = 2;
  h.record("p", false, 1, t);
  t.mode = CacheMode::NoCache;
  t.flops = 900;
  h.record("p", false, 1, t);  // switched mid-run: stays in run 1's series
  const RunSeries* s = h.find("p", false, CacheMode::Cache);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->steps(), 2u);
  EXPECT_TRUE(s->mixed());
  EXPECT_EQ(s->step_mode[1], CacheMode::NoCache);
  EXPECT_EQ(h.find("p", false, CacheMode::NoCache), nullptr);
  t.mode = CacheMode::Cache;
  h.record("p", false, 2, t);  // a new CACHE run on the same prompt replaces run 1
  s = h.find("p", false, CacheMode::Cache);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->run, 2u);
  EXPECT_EQ(s->steps(), 1u);
  EXPECT_FALSE(s->mixed());
}
