// test_frame_pacing.cpp — when the window loop draws: never while nothing changes, at the
// display rate while animating, and while the engine computes only as often as keeps
// drawing within its small share of the cores (what lets the engine run at CLI speed).
#include <gtest/gtest.h>

#include "app/ui/gui_loop.h"

using namespace kvscope::app;

namespace {

// Runs the loop's schedule for `seconds` of simulated time; each drawn frame costs
// pace.frame_ms of the UI thread. Returns the frames drawn.
int simulate(FramePace pace, double seconds) {
  double t = 0, last_draw = -1e9;
  int frames = 0;
  while (t < seconds) {
    pace.since_draw = t - last_draw;
    double wait = frame_wait(pace);
    if (wait > 0) {
      t += wait;
      continue;
    }
    ++frames;
    last_draw = t;
    t += pace.frame_ms / 1000.0;
  }
  return frames;
}

}  // namespace

TEST(FramePacing, NothingChangingDrawsNothing) {
  FramePace p;
  p.frame_ms = 20;
  p.cores = 2;
  EXPECT_EQ(simulate(p, 10.0), 0);
  EXPECT_GT(frame_wait(p), 0.0);
}

TEST(FramePacing, AnimationRunsAtTheDisplayRate) {
  FramePace p;
  p.animating = true;
  p.frame_ms = 4;
  p.cores = 2;
  int frames = simulate(p, 10.0);
  EXPECT_GE(frames, 590);
  EXPECT_LE(frames, 601);
}

TEST(FramePacing, WhileTheEngineComputesDrawingKeepsToItsShareOfTheCores) {
  for (double frame_ms : {10.0, 25.0, 40.0}) {
    for (double cores : {2.0, 8.0}) {
      FramePace p;
      p.animating = true;  // the step animation and the spinner always want frames
      p.engine_busy = true;
      p.frame_ms = frame_ms;
      p.cores = cores;
      int frames = simulate(p, 20.0);
      double share = frames * frame_ms / 1000.0 / (20.0 * cores);
      double floor_share = kBusyFpsMin * frame_ms / 1000.0 / cores;  // the minimum frame rate
      EXPECT_LE(share, std::max(kBusyShare, floor_share) * 1.05)
          << frame_ms << " ms frames, " << cores << " cores";
      EXPECT_GE(frames, int(20.0 * kBusyFpsMin) - 1);  // never a frozen window
    }
  }
  // A GPU's cheap frames are capped too, at a rate that still looks live.
  FramePace gpu;
  gpu.animating = gpu.engine_busy = true;
  gpu.frame_ms = 0.5;
  gpu.cores = 2;
  int frames = simulate(gpu, 10.0);
  EXPECT_LE(frames, int(10.0 * kBusyFpsMax) + 1);
  EXPECT_GE(frames, int(10.0 * kBusyFpsMax) - 2);
}

TEST(FramePacing, ABlinkingCursorOrANoticeTimerNeedsFourFramesASecond) {
  FramePace p;
  p.slow = true;
  p.frame_ms = 5;
  p.cores = 2;
  int frames = simulate(p, 10.0);
  EXPECT_GE(frames, 38);
  EXPECT_LE(frames, 41);
  p.changed = true;  // input meanwhile: full rate
  EXPECT_GT(simulate(p, 1.0), 50);
}

TEST(FramePacing, WaitingInputIsDrawnAtOnceWhateverTheCap) {
  FramePace p;
  p.changed = true;
  p.engine_busy = true;  // the slow case: a few frames a second
  p.frame_ms = 400;
  p.cores = 2;
  p.since_draw = 0.01;  // a frame was just drawn
  EXPECT_GT(frame_wait(p), 0.1) << "without input the cap holds the next frame back";
  p.input_waiting = true;
  EXPECT_EQ(frame_wait(p), 0.0) << "a press or release waiting is drawn now";
  p = FramePace{};
  p.input_waiting = true;
  EXPECT_EQ(frame_wait(p), 0.0) << "and never waits out the idle interval";
}
