// test_controller.cpp — the controller's worker thread driven like the UI drives it: play,
// mode toggle mid-run, prompt switch mid-step, pause/step, reset, shutdown, a typed prompt,
// a failed Reset and a failed model load. Asserts the order of what arrives (this binary also
// runs under ThreadSanitizer; the limits are in test_controller_limits.cpp, compare modes in
// test_controller_compare.cpp).
#include <gtest/gtest.h>

#include <fstream>

#include "app/core/stats_view.h"
#include "tests/app/controller_test_util.h"
#include "tests/util/kv_blocks.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::testing;

namespace {

std::unique_ptr<Controller> make_default(int max_tokens = 64) {
  auto s = default_session(max_tokens);
  return s ? std::make_unique<Controller>(std::move(s), test_options()) : nullptr;
}

}  // namespace

TEST(Controller, PlayToggleModeSwitchPromptAndShutdownInOrder) {
  auto ctl = make_default();
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
  EXPECT_EQ(ev.front().kind, Event::Kind::Source) << "the model's facts come first";
  uint64_t run = 0;
  int expect_step = 1;
  CacheMode mode = CacheMode::Cache;
  bool saw_mode_change = false, saw_run2 = false;
  for (const Event& e : ev) {
    if (e.kind == Event::Kind::Source) continue;
    ASSERT_GE(e.run, run) << "events of an older run arrived after a newer one";
    if (e.kind == Event::Kind::Reset) {
      EXPECT_EQ(e.run, run + 1);
      run = e.run;
      expect_step = 1;
      saw_run2 |= run == 2;
      EXPECT_EQ(e.prompt_text, run == 1 ? kStory.text : kCode.text);
      EXPECT_TRUE(e.store) << "every live run gets a history spool";
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
      EXPECT_NE(e.offset, kNoOffset) << "the step was not kept in the history spool";
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
  auto ctl = make_default();
  if (!ctl) GTEST_SKIP() << "default model not found";
  std::vector<Event> ev;
  ctl->send(CmdReset{kStory, false});
  collect(*ctl, ev, [](auto& e) { return count_kind(e, Event::Kind::Reset, 1) > 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), 0) << "a reset without autoplay must not step";

  ctl->send(CmdStep{});
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 1) >= 1; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), 1);
  EXPECT_FALSE(ctl->state().playing);

  // Slow playback is paced: at 2 tok/s, a step starts half a second after the one before at
  // the earliest. A busy machine can only make steps later, so the gaps between the paced
  // steps' starts (when each finished, less its own time) are checked from below; unpaced,
  // the tiny steps would start milliseconds apart.
  ctl->send(CmdSpeed{2.0f});
  ctl->send(CmdPlay{});
  const size_t first_paced = ev.size();
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 1) >= 4; });
  ctl->send(CmdPause{});
  std::vector<double> starts;
  for (size_t i = first_paced; i < ev.size(); ++i)
    if (ev[i].kind == Event::Kind::Step && ev[i].trace)
      starts.push_back(ev[i].done_s - ev[i].trace->ms / 1000.0);
  ASSERT_GE(starts.size(), 3u);
  for (size_t i = 1; i < starts.size(); ++i)
    EXPECT_GE(starts[i] - starts[i - 1], 0.45) << "paced steps " << i - 1 << " and " << i;
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
  const int n = count_steps(ev, 1);
  EXPECT_GE(n, 4);  // the Step above and the paced steps before Pause
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), n) << "steps arrived after Pause";

  ctl->send(CmdStop{});
  ctl->send(CmdStep{});  // ignored: the run is finished
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  wait_idle();
  EXPECT_EQ(count_steps(ev, 1), n);
  ASSERT_EQ(ev.back().kind, Event::Kind::Finished);
  EXPECT_EQ(ev.back().reason, FinishReason::Stopped) << "Stop's reason is 'stopped'";
  EXPECT_TRUE(ctl->state().finished);
  Timeline tl;
  for (const Event& e : ev) tl.apply(e);
  EXPECT_EQ(tl.finish_reason(), FinishReason::Stopped);
}

TEST(Controller, MaxTokensFinishesTheRunAndTimelineFollows) {
  auto ctl = make_default(/*max_tokens=*/4);
  if (!ctl) GTEST_SKIP() << "default model not found";
  std::vector<Event> ev;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 1); });
  ASSERT_EQ(ev.back().kind, Event::Kind::Finished);
  EXPECT_EQ(ev.back().reason, FinishReason::MaxTokens);
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

TEST(Controller, TypedPromptReachesTheEngine) {
  auto ctl = make_default(2);
  if (!ctl) GTEST_SKIP() << "default model not found";
  // What a person types in the prompt box, raw and as a chat turn.
  const std::string typed = "My own words: the lighthouse keeper counted ships";
  std::vector<Event> ev;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{PromptSpec{typed, false}, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 1); });
  ctl->send(CmdReset{PromptSpec{typed, true}, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 2); });
  std::string raw, chat;
  for (const Event& e : ev) {
    if (e.kind == Event::Kind::Reset) {
      EXPECT_EQ(e.prompt_text, typed);
    }
    if (e.kind == Event::Kind::Reset) {
      EXPECT_EQ(e.prompt_chat, e.run == 2);
    }
    if (e.kind != Event::Kind::Step || e.trace->step != 1) continue;
    std::string& text = e.run == 1 ? raw : chat;
    for (const PromptToken& p : e.trace->prompt) text += p.text;
    EXPECT_EQ(e.trace->tokens_processed, int(e.trace->prompt.size()));
  }
  // The engine tokenized exactly the typed text (the default model adds no BOS).
  EXPECT_EQ(raw, typed);
  // As a chat turn: inside the model's template, as the user's message.
  EXPECT_NE(chat.find("<|im_start|>user\n" + typed + "<|im_end|>"), std::string::npos) << chat;
}

// A Reset with a prompt the engine refuses leaves the current run exactly as it was, and
// says so with an event the timeline accepts; Play then goes on with that run.
TEST(Controller, FailedResetKeepsTheRunAndTheUiCanGoOn) {
  auto ctl = std::make_unique<Controller>(tiny_source(100), test_options());
  std::vector<Event> ev;
  Timeline tl;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, false});
  ctl->send(CmdStep{});
  ctl->send(CmdStep{});
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 1) >= 2; });
  ctl->send(CmdReset{PromptSpec{"", false}, true});  // empty: refused
  collect(*ctl, ev, [](auto& e) { return count_kind(e, Event::Kind::Error, 1) > 0; });
  for (const Event& e : ev) EXPECT_TRUE(tl.apply(e)) << "the timeline dropped an event";
  const Event& err = ev.back();
  ASSERT_EQ(err.kind, Event::Kind::Error);
  EXPECT_EQ(err.origin, ErrorOrigin::Reset);
  EXPECT_EQ(err.run, 1u) << "the error is about the run still showing";
  EXPECT_NE(err.error.find("empty"), std::string::npos) << err.error;
  EXPECT_EQ(tl.run(), 1u);
  EXPECT_EQ(tl.step_count(), 2);
  EXPECT_FALSE(tl.finished());
  ControllerState st = ctl->state();
  EXPECT_FALSE(st.finished);
  EXPECT_FALSE(st.playing);

  ctl->send(CmdPlay{});
  collect(*ctl, ev, [](auto& e) { return count_steps(e, 1) >= 4; });
  ctl->send(CmdPause{});
  int expect = 1;
  for (const Event& e : ev)
    if (e.kind == Event::Kind::Step) {
      EXPECT_EQ(e.trace->step, expect++) << "run 1 continues";
    }
  EXPECT_GE(expect, 5);

  // With no run at all, a failed Reset leaves the controller idle and a good one works.
  auto fresh = std::make_unique<Controller>(tiny_source(3), test_options());
  std::vector<Event> ev2;
  fresh->send(CmdReset{PromptSpec{"", false}, true});
  collect(*fresh, ev2, [](auto& e) { return count_kind(e, Event::Kind::Error, 0) > 0; });
  EXPECT_TRUE(fresh->state().finished);
  fresh->send(CmdPlay{});
  fresh->send(CmdReset{kCode, true});
  collect(*fresh, ev2, [](auto& e) { return finished(e, 1); });
  EXPECT_EQ(count_steps(ev2, 1), 3);
}

// The numbers the Stats panel shows agree with each other: positions one way, the per-token
// KV size exact at every step, time to first token and prefill apart from decode, delivered
// speed never above the engine's, and "behind" only when the engine cannot keep up.
TEST(Controller, StatsNumbersAgree) {
  auto s = default_session(10);
  if (!s) GTEST_SKIP() << "default model not found";
  auto src = make_session_source(std::move(s));
  const ModelFacts facts = src->facts();
  const std::vector<Event> ev = play_story_to_end(std::move(src));
  ASSERT_TRUE(finished(ev, 1));
  Timeline tl;
  int prompt_len = 0;
  for (const Event& e : ev) {
    tl.apply(e);
    if (e.kind != Event::Kind::Step) continue;
    if (e.trace->step == 1) prompt_len = int(e.trace->prompt.size());
    StatsView v = make_stats_view(tl, 0, true, facts.kv_bytes_per_token);
    ASSERT_TRUE(v.has_step);
    EXPECT_EQ(v.query_pos, v.write_pos - 1);
    EXPECT_EQ(v.seq_len, v.write_pos + 1);
    EXPECT_EQ(v.kv_positions, v.write_pos) << "every position before the new token is cached";
    // The blocks of 16 positions that hold them, and KV_CACHE is exactly their bytes.
    EXPECT_EQ(v.kv_slots, (v.write_pos + 15) / 16 * 16) << "step " << v.step;
    EXPECT_EQ(v.kv_bytes, uint64_t(v.kv_slots) * facts.kv_bytes_per_token) << "step " << v.step;
  }
  StatsView v = make_stats_view(tl, 0, false);
  EXPECT_EQ(v.speed.prefill_tokens, prompt_len);
  EXPECT_EQ(v.speed.ttft_ms, tl.steps()[0]->ms);
  EXPECT_NEAR(v.speed.prefill_tok_s, 1000.0 * prompt_len / tl.steps()[0]->ms, 1e-9);
  EXPECT_EQ(v.speed.window, 8);  // steps 3..10 between completions of steps 2..10
  EXPECT_GT(v.speed.engine_tok_s, 0);
  EXPECT_LE(v.speed.delivered_tok_s, v.speed.engine_tok_s) << "delivered above the engine";
  EXPECT_EQ(v.finish_reason, "max_tokens");
  EXPECT_FALSE(v.behind);

  // A slow engine (100 ms a step) at a 30 tok/s target is behind; at 2 tok/s it is not.
  for (float target : {30.0f, 2.0f}) {
    auto slow = std::make_unique<Controller>(std::make_unique<SlowSource>(tiny_source(200), 100),
                                             test_options());
    std::vector<Event> sev;
    slow->send(CmdSpeed{target});
    slow->send(CmdReset{kCode, true});
    collect(*slow, sev, [](auto& e) { return count_steps(e, 1) >= 6; });
    Timeline stl;
    for (const Event& e : sev) stl.apply(e);
    StatsView sv = make_stats_view(stl, target, slow->state().playing);
    EXPECT_EQ(sv.behind, target > 10)
        << "target " << target << " delivered " << sv.speed.delivered_tok_s;
    EXPECT_LE(sv.speed.delivered_tok_s, sv.speed.engine_tok_s);
  }
}

// A model that fails to load leaves the controller usable: the old engine stays, and a
// controller that started with none can load one afterwards.
// With sink + window every layer holds the blocks of its S sinks and its last W positions
// once the sequence is longer: the Stats panel counts those positions and the slots of
// those blocks (not SEQ_LEN), and the per-position size stays the model's K+V
// bytes per token instead of shrinking as the sequence grows.
TEST(Controller, StatsCountThePositionsAWindowedCacheHolds) {
  test::TinyModelSpec spec;
  spec.n_layer = 2;
  const std::string path = ::testing::TempDir() + "/kvscope_tiny_stats_window.gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto model = Model::load(path);
  ASSERT_TRUE(model.ok());
  SessionConfig cfg;
  cfg.max_tokens = 24;
  cfg.stop_at_eos = false;
  cfg.limits.sink = 2;
  cfg.limits.window = 8;
  auto s = Session::create(model.value(), make_cpu_backend(1), cfg);
  ASSERT_TRUE(s.ok()) << s.error().message;
  auto src = make_session_source(std::move(s.value()));
  const ModelFacts facts = src->facts();
  const std::vector<Event> ev = play_story_to_end(std::move(src));
  ASSERT_TRUE(finished(ev, 1));
  Timeline tl;
  int windowed = 0;
  for (const Event& e : ev) {
    tl.apply(e);
    if (e.kind != Event::Kind::Step) continue;
    StatsView v = make_stats_view(tl, 0, true, facts.kv_bytes_per_token);
    // By hand (blocks of 16): the sinks' block and the blocks from the one holding the
    // oldest key the next query sees, write_pos - 7.
    const test::PagedHeldSinks want = test::paged_held(v.write_pos, 8, 2, 16);
    int positions = 0;
    for (const KvRange& r : want.held) positions += r.end - r.begin;
    EXPECT_EQ(v.kv_positions, positions) << "step " << v.step;
    EXPECT_EQ(v.kv_positions_min, v.kv_positions) << "every layer has the same window";
    EXPECT_EQ(v.kv_bytes_per_position, facts.kv_bytes_per_token) << "step " << v.step;
    EXPECT_EQ(v.kv_slots, int(want.blocks) * 16) << "step " << v.step;
    EXPECT_EQ(v.kv_bytes, want.blocks * 16 * facts.kv_bytes_per_token);
    EXPECT_LE(v.kv_slots, 3 * 16) << "the sinks' block and at most two for the window of 8";
    windowed += v.write_pos > 10;
  }
  EXPECT_GT(windowed, 10) << "the run must go well past sink + window";
}

// The Run section's KV cache edit (context 16, shift keeping 2) applied the way its Apply
// button does (with_kv_cache_of + CmdLoadModel) reaches the engine: the run goes past the
// context by shifting (the positions [2, 2 + n) dropped, the sequence never longer than 16)
// instead of stopping when the context is full. The error colouring's CmdKvErrors makes
// every step carry the measured errors of the rows it wrote.
TEST(Controller, RunSectionContextShiftReachesTheEngine) {
  test::TinyModelSpec spec;
  const std::string path = ::testing::TempDir() + "/kvscope_tiny_run_shift.gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  EngineOptions current;
  current.model_path = path;
  current.backend = "cpu";
  current.threads = 1;
  current.max_tokens = 30;
  EngineOptions edit = current;
  edit.limits.n_ctx = 16;
  edit.limits.on_full = ContextPolicy::Shift;
  edit.limits.n_keep = 2;
  ASSERT_TRUE(kv_cache_differs(edit, current));
  const EngineOptions applied = with_kv_cache_of(current, edit);
  EXPECT_FALSE(kv_cache_differs(applied, edit));
  EXPECT_EQ(applied.model_path, path);
  EXPECT_EQ(applied.max_tokens, 30);

  auto ctl = std::make_unique<Controller>(std::unique_ptr<StepSource>(), test_options());
  std::vector<Event> ev;
  ctl->send(CmdLoadModel{applied});
  ctl->send(CmdKvErrors{true});  // the error colouring's switch reaches the engine too
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{PromptSpec{"ab", false}, true});
  collect(
      *ctl, ev, [](auto& e) { return finished(e, 1); }, 60);
  ASSERT_TRUE(finished(ev, 1));
  int shifts = 0, steps = 0;
  for (const Event& e : ev) {
    if (e.kind != Event::Kind::Step || !e.trace) continue;
    const StepTrace& t = *e.trace;
    ++steps;
    EXPECT_LE(t.seq_len, 16) << "step " << t.step;
    EXPECT_NE(t.stop, StopReason::ContextFull) << "step " << t.step;
    EXPECT_EQ(t.k_err.size(), size_t(t.n_layer) * size_t(t.kv_written)) << "step " << t.step;
    if (t.shift_n > 0) {
      ++shifts;
      EXPECT_EQ(t.shift_first, 2);
      EXPECT_EQ(t.shift_n, (16 - 2) / 2);
    }
  }
  EXPECT_EQ(steps, 30);
  EXPECT_GE(shifts, 2);
}

TEST(Controller, FailedModelLoadLeavesAUsableController) {
  auto ctl = std::make_unique<Controller>(std::unique_ptr<StepSource>(), test_options());
  std::vector<Event> ev;
  EXPECT_FALSE(ctl->state().has_source);
  ctl->send(CmdReset{kStory, true});
  collect(
      *ctl, ev, [](auto& e) { return !e.empty(); }, 5);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().kind, Event::Kind::Error);
  EXPECT_EQ(ev.back().origin, ErrorOrigin::Reset);

  const std::string bad = ::testing::TempDir() + "/kvscope_not_a_model.gguf";
  { std::ofstream(bad) << "this is not a GGUF file"; }
  EngineOptions eo;
  eo.model_path = bad;
  eo.backend = "cpu";
  ctl->send(CmdLoadModel{eo});
  collect(
      *ctl, ev, [](auto& e) { return count_kind(e, Event::Kind::Error, 0) >= 2; }, 10);
  EXPECT_EQ(ev.back().origin, ErrorOrigin::Model);
  EXPECT_FALSE(ctl->state().has_source);

  test::TinyModelSpec spec;
  const std::string good = ::testing::TempDir() + "/kvscope_tiny_load.gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, good).ok());
  eo.model_path = good;
  eo.max_tokens = 3;
  ctl->send(CmdLoadModel{eo});
  ctl->send(CmdReset{kStory, true});
  collect(
      *ctl, ev, [](auto& e) { return finished(e, 1); }, 20);
  EXPECT_TRUE(ctl->state().has_source);
  EXPECT_EQ(count_kind(ev, Event::Kind::Source, 0), 1);
  EXPECT_GE(count_steps(ev, 1), 1);

  // A failed load now keeps the loaded model: a Reset still runs on it.
  eo.model_path = bad;
  ctl->send(CmdLoadModel{eo});
  ctl->send(CmdReset{kCode, true});
  collect(
      *ctl, ev, [](auto& e) { return finished(e, 2); }, 20);
  EXPECT_GE(count_steps(ev, 2), 1);
}

// The plots' comparison rule: the other mode's measured curve exists only after that
// mode really ran on the same prompt; both series are the steps each run took.
TEST(Controller, SamePromptInBothModesKeepsBothMeasuredSeries) {
  const int kSteps = 6;
  auto s = default_session(kSteps);
  if (!s) GTEST_SKIP() << "default model not found";
  auto ctl = std::make_unique<Controller>(std::move(s), test_options());
  std::vector<Event> ev;
  Timeline tl;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 1); });
  for (const Event& e : ev) tl.apply(e);
  int cache_steps = count_steps(ev, 1);
  ASSERT_EQ(cache_steps, kSteps);
  ASSERT_TRUE(tl.current_series());
  EXPECT_EQ(tl.other_series(), nullptr);

  ev.clear();
  ctl->send(CmdMode{CacheMode::NoCache});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 2); });
  for (const Event& e : ev) tl.apply(e);
  int nocache_steps = count_steps(ev, 2);
  ASSERT_EQ(nocache_steps, kSteps);

  const RunSeries* c = tl.history().find(kStory.text, kStory.chat, CacheMode::Cache);
  const RunSeries* n = tl.history().find(kStory.text, kStory.chat, CacheMode::NoCache);
  ASSERT_TRUE(c && n);
  EXPECT_EQ(tl.current_series(), n);
  EXPECT_EQ(tl.other_series(), c);
  EXPECT_EQ(int(c->flops.size()), cache_steps);
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
  EXPECT_EQ(n->flops.back(), double(tl.last()->flops));
  EXPECT_EQ(tl.history().find(kStory.text, true, CacheMode::Cache), nullptr);
  EXPECT_EQ(tl.history().find(kCode.text, false, CacheMode::Cache), nullptr);
}

TEST(RunHistory, MixedRunKeepsEachStepsModeAndNewRunReplacesOld) {
  RunHistory h;
  StepTrace t;
  t.mode = CacheMode::Cache;
  t.flops = 100;
  t.ms = 2;
  t.step = 1;
  t.seq_len = 8;
  h.record("p", false, 1, t);
  t.mode = CacheMode::NoCache;
  t.flops = 900;
  h.record("p", false, 1, t);  // switched mid-run: stays in run 1's series
  const RunSeries* s = h.find("p", false, CacheMode::Cache);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->steps(), 2u);
  EXPECT_EQ(s->prompt_len, 7);
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
