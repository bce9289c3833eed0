// test_controller_limits.cpp — the controller at its limits: Stop and close while steps are
// queued behind a long step, thousands of random commands (under ThreadSanitizer too), and a
// 4,096-step run whose history must fit a memory budget and be given back on Reset.
//
// Stop and close are checked by what ran after them (at most the step in flight), counted by
// the source, never by a wall-clock limit that a busy machine or a sanitizer can break;
// tests/app/measure_controller_latency.cpp measures the times on the real model, by hand.
#include <gtest/gtest.h>

#include <random>

#include "tests/app/controller_test_util.h"
#include "tests/util/timing.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::testing;

// How long to wait for a run to finish before the test fails (not a limit on latency).
const double kFinishTimeout = 10 * kvscope::test::time_limit_scale();

// Stop takes effect at the next step boundary: the step in flight finishes, the queued
// Steps never run.
TEST(Controller, StopWithQueuedStepsTakesEffectAtTheNextBoundary) {
  constexpr int kStepMs = 300;
  auto slow = std::make_unique<SlowSource>(tiny_source(100), kStepMs);
  const auto started = slow->steps_started();
  auto ctl = std::make_unique<Controller>(std::move(slow), test_options());
  std::vector<Event> ev;
  ctl->send(CmdReset{kStory, false});
  collect(*ctl, ev, [](auto& e) { return count_kind(e, Event::Kind::Reset, 1) > 0; });
  for (int i = 0; i < 10; ++i) ctl->send(CmdStep{});
  EXPECT_LE(ctl->queued(), kMaxQueued);
  // Wait until the first step is computing, then Stop behind the queued ones.
  for (int i = 0; i < 200 && !ctl->state().busy; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(ctl->state().busy);
  for (int i = 0; i < 10; ++i) ctl->send(CmdStep{});
  ctl->send(CmdStop{});
  const int at_stop = started->load();  // the step in flight is counted already
  collect(
      *ctl, ev, [](auto& e) { return finished(e, 1); }, kFinishTimeout);
  ASSERT_TRUE(finished(ev, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * kStepMs));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  EXPECT_EQ(count_steps(ev, 1), 1) << "only the step in flight may finish";
  EXPECT_EQ(started->load(), at_stop) << "a queued step started after Stop";
}

// Closing (destroying the controller) waits for the step in flight at most, never for what
// is queued behind it.
TEST(Controller, ShutdownWithQueuedWorkReturnsWithinOneStep) {
  constexpr int kStepMs = 400;
  auto slow = std::make_unique<SlowSource>(tiny_source(1000), kStepMs);
  const auto started = slow->steps_started();
  auto ctl = std::make_unique<Controller>(std::move(slow), test_options());
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  for (int i = 0; i < 200 && !ctl->state().busy; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(ctl->state().busy);
  for (int i = 0; i < 5000; ++i) {
    ctl->send(i % 3 == 0   ? Command(CmdStep{})
              : i % 3 == 1 ? Command(CmdMode{CacheMode(i & 1)})
                           : Command(CmdReset{kCode, true}));
    ASSERT_LE(ctl->queued(), kMaxQueued) << "the command queue grew past its bound";
  }
  // The worker may be between two steps as close begins: one more step may start, no more
  // (a step lasts 400 ms, so the count is not at the mercy of a busy machine).
  const int at_close = started->load();
  ctl.reset();
  EXPECT_LE(started->load(), at_close + 1) << "close ran the queued steps";
}

// A 4,096-step run through the controller (tiny model: it is the history that is measured,
// not the engine), drained as the app drains it: a frame every 0.2 s takes whatever the
// engine made meanwhile (hundreds of steps). Keeping every step's attention would need
// 8 rows x sum(n) x 4 bytes = 268 MB here (4.5 GB for the default model at fp16), and the
// queue alone would hold up to 128 KB x the steps of one frame; the queue keeps only its
// newest step's rows, the timeline keeps slim steps and reads old ones back from the spool,
// so its memory and the process's peak growth (VmHWM, exact) stay small, any step can still
// be looked at, and a Reset gives the memory back.
TEST(ControllerHistory, FourThousandStepsStayWithinBudgetAndResetReturnsMemory) {
  const int kSteps = kTsan ? 1024 : 4096;
  constexpr size_t kTimelineBudget = 24u << 20;  // bytes the timeline may hold at 4,096 steps
  // Peak process growth over the run: 10-12 MiB measured; 23 MiB when the queue kept every
  // waiting step's rows.
  constexpr uint64_t kRssBudget = 20ull << 20;
  constexpr uint64_t kRssAfterReset = 16ull << 20;  // what may stay after Reset
  // Under a sanitizer, whose allocator makes RSS meaningless, the same budgets apply to the
  // heap bytes the program holds by the sanitizer's own count (sanitizer_heap_bytes).
  constexpr auto kFrame = std::chrono::milliseconds(200);
  auto src = tiny_source(kSteps, kSteps + 64, /*n_layer=*/2, /*n_head=*/4);
  ASSERT_TRUE(src);
  // At least 1 ms a step, so that frames come every couple of hundred steps as in the app.
  auto ctl =
      std::make_unique<Controller>(std::make_unique<SlowSource>(std::move(src), 1), test_options());
  Timeline tl;
  std::vector<Event> ev;
  collect(
      *ctl, ev, [](auto& e) { return !e.empty(); }, 10);
  for (const Event& e : ev) tl.apply(e);
  release_free_memory();
  const uint64_t rss0 = process_resident_bytes();
  ASSERT_GT(rss0, 0u);
  const bool exact_peak = reset_peak_resident();  // VmHWM from here on
  const std::optional<uint64_t> heap0 = sanitizer_heap_bytes();
  uint64_t heap_peak = heap0.value_or(0);

  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  const int kProbe = kSteps / 4;
  int probe_step = 0;  // the first step from kProbe on that came with its attention
  std::vector<float> probe_attention;
  uint64_t rss_peak = 0;
  int most_in_a_frame = 0;
  bool done = false;
  auto until = std::chrono::steady_clock::now() + std::chrono::minutes(5);
  while (!done && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(kFrame);
    std::vector<Event> frame = ctl->poll();
    // Only the newest step of a frame's batch comes with its attention rows.
    const Event* newest = nullptr;
    int steps = 0;
    for (const Event& e : frame)
      if (e.kind == Event::Kind::Step) {
        newest = &e;
        ++steps;
      }
    most_in_a_frame = std::max(most_in_a_frame, steps);
    for (const Event& e : frame) {
      if (e.kind == Event::Kind::Step) {
        EXPECT_EQ(e.trace->attention.empty(), &e != newest) << "step " << e.trace->step;
        if (&e == newest && probe_step == 0 && e.trace->step >= kProbe) {
          probe_step = e.trace->step;
          probe_attention = e.trace->attention;
        }
      }
      done |= e.kind == Event::Kind::Finished;
      ASSERT_TRUE(tl.apply(e));
    }
    rss_peak = std::max(rss_peak, process_resident_bytes());
    heap_peak = std::max(heap_peak, sanitizer_heap_bytes().value_or(0));
  }
  ASSERT_TRUE(done) << "the run did not finish in time (" << tl.step_count() << " steps)";
  ASSERT_EQ(tl.step_count(), kSteps);
  const uint64_t rss_end = process_resident_bytes();
  rss_peak = std::max(rss_peak, rss_end);
  if (exact_peak) rss_peak = std::max(rss_peak, process_peak_resident_bytes());
  const size_t tl_bytes = tl.memory_bytes();
  std::printf(
      "history at %d steps (up to %d a frame): timeline %.1f MiB, RSS %.1f -> %.1f MiB "
      "(peak %.1f, %s), spool %.1f MiB on disk\n",
      kSteps, most_in_a_frame, tl_bytes / 1048576.0, rss0 / 1048576.0, rss_end / 1048576.0,
      rss_peak / 1048576.0, exact_peak ? "VmHWM" : "sampled per frame",
      tl.store()->bytes() / 1048576.0);
  EXPECT_GT(most_in_a_frame, 1) << "no frame took more than one step: the queue went untested";
  EXPECT_LE(tl_bytes, kTimelineBudget);
  if (heap0) {
    heap_peak = std::max(heap_peak, *sanitizer_heap_bytes());
    std::printf("heap in use (sanitizer's count): %.1f MiB before the run, peak %.1f MiB\n",
                *heap0 / 1048576.0, heap_peak / 1048576.0);
    EXPECT_LE(heap_peak, *heap0 + kRssBudget) << "heap in use grew past the budget";
  } else {
    EXPECT_LE(rss_peak, rss0 + kRssBudget);
  }

  // Any step can be looked at again, with the attention it had (fp16 in the spool).
  ASSERT_GE(probe_step, kProbe);
  ASSERT_LT(probe_step, kSteps) << "no step between " << kProbe << " and the end was probed";
  ASSERT_EQ(probe_attention.size(), size_t(2 * 4) * size_t(tl.steps()[probe_step - 1]->n_attn));
  tl.scrub_to(probe_step);
  ASSERT_FALSE(tl.live());
  ASSERT_TRUE(tl.viewed());
  EXPECT_EQ(tl.viewed()->step, probe_step);
  EXPECT_EQ(tl.viewed_note(), "");
  ASSERT_EQ(tl.viewed()->attention.size(), probe_attention.size());
  for (size_t i = 0; i < probe_attention.size(); ++i)
    ASSERT_NEAR(tl.viewed()->attention[i], probe_attention[i], 1e-3f * probe_attention[i] + 1e-7f)
        << i;
  EXPECT_EQ(tl.viewed_seq_len(), tl.steps()[probe_step - 1]->seq_len);
  tl.follow_live();
  EXPECT_TRUE(tl.live());
  EXPECT_EQ(tl.viewed()->step, kSteps);

  ctl->send(CmdReset{kCode, false});
  ev.clear();
  collect(
      *ctl, ev, [](auto& e) { return count_kind(e, Event::Kind::Reset, 2) > 0; }, 10);
  for (const Event& e : ev) tl.apply(e);
  ev.clear();
  EXPECT_EQ(tl.step_count(), 0);
  release_free_memory();
  const uint64_t rss_reset = process_resident_bytes();
  std::printf("after Reset: RSS %.1f MiB (before the run %.1f MiB)\n", rss_reset / 1048576.0,
              rss0 / 1048576.0);
  if (heap0) {
    const uint64_t heap_reset = *sanitizer_heap_bytes();
    std::printf("after Reset: heap in use %.1f MiB\n", heap_reset / 1048576.0);
    EXPECT_LE(heap_reset, *heap0 + kRssAfterReset) << "Reset did not free the history's heap";
  } else {
    EXPECT_LE(rss_reset, rss0 + kRssAfterReset) << "Reset did not give the memory back";
  }
}

// Thousands of random commands, as fast as a hand on the controls and faster, while a UI-like
// loop drains events. The event order stays consistent, the queue stays bounded, and Stop and
// close wait for the step in flight at most (no queued step starts after them).
TEST(ControllerStress, RandomCommandsKeepOrderBoundsAndLatency) {
  constexpr int kCommands = 3000;
  auto counted = std::make_unique<SlowSource>(tiny_source(300), 0);
  const auto started = counted->steps_started();
  auto ctl = std::make_unique<Controller>(std::move(counted), test_options());
  std::mt19937 rng(12345);
  Timeline tl;
  std::vector<uint64_t> next_step(1, 1);  // per run: the step number expected next
  std::vector<bool> run_finished(1, false);
  uint64_t last_run = 0;
  double max_step_s = 0;
  int steps_seen = 0, errors = 0;
  auto drain = [&](std::vector<Event> evs) {
    for (Event& e : evs) {
      if (e.kind == Event::Kind::Source) continue;
      ASSERT_GE(e.run, last_run) << "an event of an older run arrived late";
      if (e.kind == Event::Kind::Reset) {
        ASSERT_EQ(e.run, last_run + 1);
        last_run = e.run;
        next_step.push_back(1);
        run_finished.push_back(false);
      }
      if (e.kind == Event::Kind::Step) {
        ASSERT_EQ(e.run, last_run);
        ASSERT_FALSE(run_finished[e.run]) << "a step after its run finished";
        ASSERT_EQ(uint64_t(e.trace->step), next_step[e.run]++);
        max_step_s = std::max(max_step_s, e.trace->ms / 1000.0);
        ++steps_seen;
      }
      if (e.kind == Event::Kind::Finished) run_finished[e.run] = true;
      if (e.kind == Event::Kind::Error) ++errors;
      EXPECT_TRUE(tl.apply(e));
    }
  };
  const PromptSpec prompts[] = {kStory, kCode, PromptSpec{"", false}, PromptSpec{"hi", true}};
  auto probe_stop = [&](const char* when) {
    // A fresh run (its Reset seen), steps queued behind the one in flight, then Stop.
    const std::string text = std::string("probe ") + when;
    ctl->send(CmdSpeed{kSpeedMax});
    ctl->send(CmdReset{PromptSpec{text, false}, false});
    for (int i = 0; i < 2000 && tl.prompt_text() != text; ++i) drain(ctl->wait_events(5));
    ASSERT_EQ(tl.prompt_text(), text);
    const uint64_t run = last_run;
    ASSERT_FALSE(run_finished[run]) << when;
    ctl->send(CmdStep{});
    for (int i = 0; i < 200 && !ctl->state().busy; ++i)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    for (int i = 0; i < 40; ++i) ctl->send(CmdStep{});
    ASSERT_LE(ctl->queued(), kMaxQueued);
    auto t0 = std::chrono::steady_clock::now();
    ctl->send(CmdStop{});
    // Read after the send: steps counted before it may have run before the worker saw Stop.
    const int at_stop = started->load();
    while (seconds_since(t0) < kFinishTimeout) {
      drain(ctl->wait_events(5));
      if (run_finished[run]) break;
    }
    ASSERT_TRUE(run_finished[run])
        << when << " run " << run << " last " << last_run << " busy " << ctl->state().busy
        << " fin " << ctl->state().finished << " queued " << ctl->queued();
    // One step the worker was about to start as Stop arrived, and no more.
    EXPECT_LE(started->load(), at_stop + 1) << "queued steps ran after Stop " << when;
  };

  for (int i = 0; i < kCommands; ++i) {
    const int k = int(rng() % 100);
    if (k < 25) {
      ctl->send(CmdStep{});
    } else if (k < 35) {
      ctl->send(CmdPlay{});
    } else if (k < 45) {
      ctl->send(CmdPause{});
    } else if (k < 55) {
      ctl->send(CmdSpeed{rng() % 4 == 0 ? kSpeedMax : 0.25f + float(rng() % 3000) / 100.0f});
    } else if (k < 65) {
      ctl->send(CmdMode{CacheMode(rng() % 2)});
    } else if (k < 68) {
      SamplerConfig s;
      s.temperature = float(rng() % 3) * 0.5f;
      s.seed = rng();
      ctl->send(CmdSampler{s});
    } else if (k < 71) {
      ctl->send(CmdMaxTokens{1 + int(rng() % 64)});
    } else if (k < 79) {
      ctl->send(CmdStop{});
    } else if (k < 93) {
      ctl->send(CmdReset{prompts[rng() % 4], rng() % 2 == 0});
    } else if (k < 95) {
      ctl->send(CmdCompare{prompts[rng() % 2], 2 + int(rng() % 4)});
    } else if (k < 97) {
      ctl->send(CmdSave{::testing::TempDir() + "/kvscope_stress.kvs", tl.run()});
    } else {
      tl.scrub_to(1 + int(rng() % uint32_t(std::max(1, tl.step_count()))));
    }
    ASSERT_LE(ctl->queued(), kMaxQueued) << "after command " << i;
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 5000));
    drain(ctl->poll());
    if (::testing::Test::HasFatalFailure()) return;
    if (i % 1000 == 999) probe_stop(i == 999 ? "after 1000" : "after 2000");
  }
  probe_stop("at the end");
  std::printf("stress: %d steps over %llu runs, %d errors reported, longest step %.1f ms\n",
              steps_seen, static_cast<unsigned long long>(last_run), errors, max_step_s * 1000);
  EXPECT_GT(steps_seen, 25);

  // Close while playing with work queued.
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  for (int i = 0; i < 40; ++i) ctl->send(CmdStep{});
  ctl->send(CmdCompare{kCode, 8});
  // Close must not hang behind the queue; how much it may run after it began is checked in
  // ShutdownWithQueuedWorkReturnsWithinOneStep, where steps are long enough to count it.
  ctl.reset();
}
