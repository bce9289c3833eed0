// scene_view.h — the 3D view in its rectangle: the cached scene, the camera framed for
// that rectangle, pointer input, picking, and drawing.
//
// A new run (its id changed) is framed by the preset at once, undoing the person's zoom and
// pan, so the view shows the new sequence from its first frame.
// The scene's instances are rebuilt only when the timeline or the view options change;
// other frames only animate it. The camera's aspect is always the rectangle's, so a
// preset frames its content inside the free rectangle, never behind a panel. While the
// camera looks down (TOP), the most-attended tokens' labels are laid flat where they fit
// (place_flat_labels), placed again when the zoom changes by more than kFlatRelayout. No ImGui:
// the window loop and the headless capture drive it alike.
#pragma once

#include <cstdint>
#include <vector>

#include "app/scene/scene_builder.h"
#include "app/core/timeline.h"
#include "app/scene/window_layout.h"
#include "render/camera.h"
#include "render/renderer.h"
#include "render/scene.h"

namespace kvscope::app {

// Pointer state for one frame, in window points.
struct ViewInput {
  float mouse_x = -1, mouse_y = -1;
  float dx = 0, dy = 0;  // pointer motion since the last frame
  bool orbit = false;    // left button dragging in the view
  bool pan = false;      // right or middle button dragging in the view
  float wheel = 0;       // scroll steps this frame (> 0 zooms in)
  bool hover = false;    // the pointer is over the view and not over a panel
};

struct ViewFrame {
  const Timeline* timeline = nullptr;
  ViewOptions view;
  AnimClock clock;
  render::CameraPreset preset = render::CameraPreset::ThreeQuarter;
  bool preset_changed = false;  // a preset was chosen this frame (starts a transition)
  UiRect rect;                  // the free rectangle, window points
  float dt = 0;                 // seconds since the last frame; <= 0 jumps to the goal
  int look_at_pos = -1;         // >= 0: bring this position to the middle of the view
};

class SceneView {
 public:
  // Brings the scene and camera up to date for this frame.
  void update(const ViewFrame& f, const ViewInput& in);
  // Draws into the rectangle of the last update, scaled by `fb_scale` (pixels per point).
  void draw(render::Renderer& r, int fb_width, int fb_height, float fb_scale);

  const render::Scene& scene() const { return scene_; }
  render::Camera& camera() { return camera_; }
  // The token under the pointer at the last update (-1: none).
  int hovered_token() const { return hovered_; }
  // The first and last positions whose tokens project inside the rectangle (-1 if none).
  int shown_first() const { return shown_first_; }
  int shown_last() const { return shown_last_; }
  // True while something on screen still moves (camera transition, step animation).
  bool animating() const { return animating_; }

 private:
  void update_flat_labels();

  render::Scene scene_;
  render::Camera camera_;
  UiRect rect_;
  struct Built {
    uint64_t run = ~0ull;
    size_t steps = 0, tokens = 0;
    int viewed = 0;  // the step looked at through the history (0: the newest, live)
    ViewOptions view;
    bool valid = false;
  } built_;
  // Flat labels when the camera looks down: the priority order from the last build and the
  // token spacing (quantized) they were placed for; -1: none placed.
  std::vector<int> label_priority_;
  float flat_px_ = -1.0f;
  int hovered_ = -1, shown_first_ = -1, shown_last_ = -1;
  bool animating_ = true;
  bool initialized_ = false;  // the first update places the camera without a transition
  render::BeamArc arc_;       // the beams' shape now (eases toward the preset's)
};

// Flat labels while the camera's pitch is at least this (degrees); re-placed when the token
// spacing on screen changes by more than this factor.
inline constexpr float kFlatPitchDeg = 60.0f;
inline constexpr float kFlatRelayout = 1.15f;

// The nearest token whose block projects within `radius` points of (x, y), or -1.
int pick_token(const render::Scene& s, UiRect rect, float x, float y, float radius = 28.0f);
// The viewport in framebuffer pixels for a rectangle in window points.
render::Viewport to_viewport(UiRect rect, float fb_scale);

}  // namespace kvscope::app
