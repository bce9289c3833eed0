// capture_options.cpp — the app's capture and window groups (see capture_options.h).
#include "app/options/capture_options.h"

#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/options/options.h"

namespace kvscope::cli {

void add_capture_options(CLI::App& app, CaptureArgs& o) {
  app.add_option("--screenshot", o.screenshot,
                 "Draw the app offscreen into this PNG and exit (no display needed)");
  app.add_option("--replay", o.replay, "Play a recorded run file (.kvs) instead of the model");
  app.add_option("--steps", o.steps, "Screenshot: steps to run (default 12)")
      ->check(Range(1, kMaxCaptureSteps));
  app.add_option("--size", o.size, "Image (or window) size WxH, e.g. 1280x720")->check(SizeWxH());
  app.add_option("--camera", o.camera,
                 std::string("Camera preset: ") + kCameraChoices +
                     "; a list (top,3/4) writes one screenshot each");
  app.add_option("--layer", o.layer, "Show this layer's attention")
      ->check(Range(0, kMaxLayerOption));
  app.add_option("--head", o.head, "Show this head, or the mean / max over the heads")
      ->check(WordsOrRange({"mean", "max"}, 0LL, kMaxLayerOption));
  app.add_flag("--all-layers", o.all_layers, "Average the attention over every layer");
  app.add_flag("--no-sink", o.no_sink, "Drop position 0 and renormalize the rest");
  app.add_flag("--scene-only", o.scene_only, "Screenshot without the panels");
  app.add_option("--highlight", o.highlight, "Screenshot: show this token as if pointed at")
      ->check(Range(0, kMaxPositionsOption));
  app.add_flag("--compare-modes", o.compare_modes,
               "Screenshot: --steps N with the cache, then without");
  app.add_flag("--compare-interleaved", o.compare_interleaved,
               "Screenshot: the same, both at once step by step");
  app.add_option("--view-step", o.view_step, "Screenshot: look at step K through the history")
      ->check(Range(1, kMaxTokensOption));
  app.add_option("--sections", o.sections, "Screenshot: open only these panel sections (A,B)");
  app.add_option("--speed", o.speed, "Tokens per second, or max")
      ->check(WordsOrRange({"max"}, kSpeedOptionMin, kSpeedOptionMax));
  app.add_option("--look-at", o.look_at,
                 "Screenshot: the camera slides along the sequence to this position")
      ->check(Range(0, kMaxPositionsOption));
  app.add_option("--anim-time", o.anim_time,
                 "Screenshot: seconds after the last step (default 0.45; 0.3 catches a context "
                 "shift mid-slide)")
      ->check(Range(0.0, kMaxAnimTime));
  app.add_flag("--kv-error", o.kv_error,
               "Measure each K/V row's quantization error and colour the blocks by it");
  app.add_option("--cache-quality", o.cache_quality,
                 "Screenshot: the Cache quality section, this cache against f16 with the full "
                 "context over N steps")
      ->check(Range(1, kMaxCaptureSteps));
}

void add_window_options(CLI::App& app, WindowArgs& o) {
  app.add_flag("--play", o.play, "Start playing right away");
  add_frames_option(app, o.frames, "Quit after N frames");
  app.add_option("--window-shot", o.window_shot, "Save the last frame as this PNG");
  app.add_option("--measure", o.measure,
                 "Play N steps flat out, print engine step and frame times, quit (with "
                 "--screenshot: drawn offscreen, no display needed; the last frame is saved)")
      ->check(Range(1, kMaxTokensOption));
  app.add_option("--ui-nice", o.ui_nice,
                 "Lower the UI thread's priority by N (default 5; 0 = off)")
      ->check(Range(0, kMaxUiNice));
}

void add_frames_option(CLI::App& app, int& frames, const std::string& help) {
  app.add_option("--frames", frames, help)->check(Range(1, kMaxFramesOption));
}

}  // namespace kvscope::cli
