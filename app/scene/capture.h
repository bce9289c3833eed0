// capture.h — the pieces of headless capture: run the real engine for N steps into a
// timeline, build a settled scene framed by a preset, render it offscreen. The whole-app
// capture (`--screenshot`, with the panels) is app_capture.h.
#pragma once

#include <string>
#include <vector>

#include "app/core/engine_setup.h"
#include "app/core/timeline.h"
#include "app/scene/scene_builder.h"
#include "render/camera.h"
#include "render/renderer.h"

namespace kvscope::app {

struct CaptureOptions {
  std::string out_path;
  std::string prompt_file;  // empty = the first offered prompt
  int steps = 12;
  CacheMode mode = CacheMode::Cache;
  render::CameraPreset camera = render::CameraPreset::ThreeQuarter;
  // More presets for one screenshot run (`--camera top,3/4`): one PNG each, named
  // OUT-top.png, OUT-34.png, ... The engine runs once.
  std::vector<render::CameraPreset> more_cameras;
  ViewOptions view;
  int width = 1280, height = 720;
  std::string model_path;
  std::string backend = "auto";
  std::string replay_path;   // capture a recorded run (no model) instead of running the model
  bool steps_given = false;  // --steps was passed (a replay otherwise shows every step)
  bool compare = false;      // --compare: `steps` with the KV cache, then `steps` without
  bool compare_interleaved = false;  // --compare-interleaved: both at once, step by step
  int view_step = 0;         // --view-step K: look at step K through the history (0: newest)
  std::string sections;      // --sections A,B: open those panel sections only
  int max_tokens = 0;        // the app: --max-tokens N (0: the UI's default)
  float speed = 0;           // the app: --speed TOK_S, or kSpeedMax (-1 here: as fast as possible)
  KvTypes kv_types;          // the KV cache: element types, context size, sink + window
  KvLimits limits;
  KvPolicy kv_policy = KvPolicy::ModelWindow;  // --kv-keep window|full
  int kv_block = 16;                           // --kv-block
  bool kv_errors = false;  // --kv-error: measure the rows' quantization error (and colour by it)
  // > 0 (screenshot): run the Cache quality comparison of this cache against the f16
  // full-context reference for this many steps and show that section alone (unless
  // --sections says otherwise).
  int quality_steps = 0;
  int look_at_pos = -1;      // >= 0 (screenshot): the camera slides to this position
  double since_step = 0.45;  // animation time of the captured frame after the last step
};

// The engine the capture options name (model, backend, KV cache), in `mode`, for
// `max_tokens` steps: what the window and a screenshot open.
EngineOptions engine_options(const CaptureOptions& cap, CacheMode mode, int max_tokens);

// Resets `session` with `prompt` and runs up to `steps` steps (fewer if it stops),
// feeding every trace into `timeline` in order.
Status run_steps(Session& session, const PromptSpec& prompt, int steps, Timeline* timeline);

// The scene for a settled frame, framed by `preset` for a width x height image.
render::Scene capture_scene(const Timeline& tl, const ViewOptions& view, double since_step,
                            render::CameraPreset preset, int width, int height);

// Draws into an offscreen MSAA target and reads RGBA8 back (top row first).
Expected<std::vector<uint8_t>> render_offscreen(render::Renderer& r, const render::Scene& scene,
                                                int width, int height);

}  // namespace kvscope::app
