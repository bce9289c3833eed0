// app_capture.h — the whole app window (panels and 3D view) rendered offscreen, as a
// user would see it: `kvscope --screenshot`, and the tests that check what is visible.
//
// Uses the same layout, panels and scene view as the window; only the input is absent
// (no pointer, no keys) and the camera jumps straight to the preset's framing.
#pragma once

#include <cstdint>
#include <vector>

#include "app/scene/capture.h"
#include "app/core/engine_setup.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

struct AppShot {
  int width = 1280, height = 720;  // window size in pixels (UI scale 1)
  render::CameraPreset preset = render::CameraPreset::ThreeQuarter;
  double since_step = 2.0;  // animation time after the newest step (2 s: settled)
  int frames = 3;           // UI frames drawn before the captured one (windows settle)
  bool panels = true;       // false: the 3D view fills the whole image, no UI
  int look_at_pos = -1;     // >= 0: the camera slides along the sequence to this position
};

struct AppShotResult {
  std::vector<uint8_t> rgba;  // width x height RGBA8, top row first
  UiLayout layout;            // the regions of the captured frame
  render::Viewport view;      // the 3D view's rectangle in pixels
  render::Scene scene;        // the scene as drawn, with its camera
};

// Renders `tl` through the app's UI into an offscreen image. Needs a current OpenGL 3.3
// context; makes (and destroys) its own ImGui context. `ui` holds the panels' state.
Expected<AppShotResult> capture_app(render::Renderer& r, UiState& ui, const Timeline& tl,
                                    const AppShot& shot);

// Export PNG: renders `scene` (with its camera) at width x height, as the 3D view shows it,
// into `dir`/kvscope-view-NNN.png with the first NNN not taken; returns the absolute path.
Expected<std::string> export_view_png(render::Renderer& r, const render::Scene& scene, int width,
                                      int height, const std::string& dir);
// The same into `path` (the save dialog's choice); returns the absolute path.
Expected<std::string> export_view_png_to(render::Renderer& r, const render::Scene& scene, int width,
                                         int height, const std::string& path);
// The first kvscope-view-NNN.png not taken in `dir` (the name alone), "" when none is left.
std::string free_view_png_name(const std::string& dir);

// What the panels show about the model, from an opened engine.
ModelFacts model_facts(const EngineHandle& h);

// `kvscope --screenshot OUT [...]`: runs the engine, captures, writes the PNG. Works
// with no display server (EGL); returns the process exit code, one line on error.
int run_screenshot(const CaptureOptions& opts, bool panels);

}  // namespace kvscope::app
