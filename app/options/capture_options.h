// capture_options.h — the app's own options: what a screenshot (or the window) shows
// (the capture group) and how the window runs (the window group). The values are checked
// here, when the command line is parsed, before any window, GL context or model is opened;
// app/ui/app_main.cpp turns them into the app's CaptureOptions / GuiOptions. The image
// size (--size WxH) is parsed by cli::parse_size / cli::SizeWxH (options.h), also used by
// bench-render.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace kvscope::cli {

inline constexpr int kMaxCaptureSteps = 100000;  // --steps, --cache-quality: 1..100000
inline constexpr int kMaxLayerOption = 4095;     // --layer, --head: 0..4095
inline constexpr double kMaxAnimTime = 60.0;     // --anim-time: [0, 60] seconds
// --speed: tokens per second in [0.25, 30], or max (app/core/controller.h kSpeedMin /
// kSpeedTop; app_main.cpp checks they agree).
inline constexpr double kSpeedOptionMin = 0.25, kSpeedOptionMax = 30.0;
inline constexpr int kMaxFramesOption = 1000000;  // --frames (the app, bench-render)
inline constexpr int kMaxUiNice = 19;             // --ui-nice: 0..19

// Names of the camera presets, for --camera's help and message (render/camera.h parses them).
inline constexpr const char* kCameraChoices = "top, side, front, 3/4, follow";

struct CaptureArgs {
  std::string screenshot;  // --screenshot OUT.png: draw offscreen instead of a window
  std::string replay;      // --replay RUN.kvs: a recorded run instead of the model
  int steps = 0;           // --steps N
  std::string size;        // --size WxH
  std::string camera;      // --camera PRESET[,PRESET...]
  int layer = 0;           // --layer L
  std::string head;        // --head H|mean|max
  bool all_layers = false, no_sink = false, scene_only = false;
  int highlight = -1;      // --highlight POS
  bool compare_modes = false, compare_interleaved = false;
  int view_step = 0;       // --view-step K
  std::string sections;    // --sections A,B
  std::string speed;       // --speed TOK_S|max
  int look_at = -1;        // --look-at POS
  double anim_time = 0;    // --anim-time S
  bool kv_error = false;   // --kv-error
  int cache_quality = 0;   // --cache-quality N
};

struct WindowArgs {
  bool play = false;        // --play
  int frames = 0;           // --frames N: quit after N frames
  std::string window_shot;  // --window-shot OUT.png
  int measure = 0;          // --measure N
  int ui_nice = 0;          // --ui-nice N
};

void add_capture_options(CLI::App& app, CaptureArgs& o);
void add_window_options(CLI::App& app, WindowArgs& o);
// bench-render's --frames, with the app's bound.
void add_frames_option(CLI::App& app, int& frames, const std::string& help);

}  // namespace kvscope::cli
