// serving_scene.h — a serving run's snapshot (app/core/serving_run.h) as a 3D scene: the
// sequences as lanes of tokens, the pool of KV blocks as a grid of tiles under them, the
// lines of a lane's block table to its tiles, and the write heads.
//
// Pure functions of their inputs (the headless capture, the window and the tests build
// identical scenes); ServingView adds the camera, pointer input and picking, as SceneView
// does for the single-sequence view. No ImGui.
#pragma once

#include <cstdint>
#include <vector>

#include <glm/vec2.hpp>
#include <glm/vec3.hpp>

#include "app/core/serving_run.h"
#include "app/scene/scene_builder.h"
#include "app/scene/scene_view.h"
#include "app/scene/window_layout.h"
#include "render/camera.h"
#include "render/renderer.h"
#include "render/scene.h"

namespace kvscope::app {

struct ServingViewOptions {
  int selected_seq = -1;  // its block-table lines and attention beams are drawn
  int hovered_seq = -1;   // its block-table lines are drawn too
  int hovered_tile = -1;  // outlined; its owners' lanes highlighted
  bool labels = true;     // token text over the lanes
  bool operator==(const ServingViewOptions&) const = default;
};

// The colour of palette entry `i` (a sequence's request), linear RGB; distinct for the
// first 16 and cycling after.
glm::vec3 serving_color(int i);
// Free tiles' and cached (unreferenced) tiles' colours.
glm::vec3 serving_free_color();
glm::vec3 serving_cached_color(int i);

// Where things are, in world units: lane `k` (the k-th lane drawn) is a row of tokens at
// y = lane_y(k); tile `b` sits at tile_center(b). The scene's tokens are the lanes' tokens
// (in lane order, position order), its kv_blocks the tiles (in block id order).
struct ServingGeometry {
  int columns = 1;            // tiles per grid row
  std::vector<int> lane_seq;  // the sequence drawn in each lane, top first
  glm::vec3 tile_center(int block) const;
  glm::vec3 token_center(int lane, int pos) const;
  float lane_y(int lane) const;
  glm::vec3 pool_min{0.0f}, pool_max{0.0f};    // the grid's bounds
  glm::vec3 lanes_min{0.0f}, lanes_max{0.0f};  // the lanes' bounds
};
ServingGeometry serving_geometry(const ServingSnapshot& s);

// The scene for snapshot `s` (a fresh revision) and its animation for `clock`.
render::Scene build_serving_scene(const ServingSnapshot& s, const ServingViewOptions& opts,
                                  const AnimClock& clock);

struct ServingFrame {
  std::shared_ptr<const ServingSnapshot> snapshot;
  ServingViewOptions view;
  AnimClock clock;
  UiRect rect;   // the free rectangle, window points
  float dt = 0;  // seconds since the last frame; <= 0 jumps to the goal
};

struct ServingPick {
  int tile = -1;  // block id under the pointer
  int seq = -1;   // lane (sequence) under the pointer
  int pos = -1;   // the token position in that lane
};

class ServingView {
 public:
  // Brings the scene and camera up to date (rebuilds only when the snapshot or the options
  // change); the camera frames lanes and pool inside `rect`, and the input orbits, pans and
  // zooms it as in the single-sequence view.
  void update(const ServingFrame& f, const ViewInput& in);
  void draw(render::Renderer& r, int fb_width, int fb_height, float fb_scale);
  const render::Scene& scene() const { return scene_; }
  const ServingGeometry& geometry() const { return geom_; }
  // What is under the pointer at the last update.
  ServingPick picked() const { return pick_; }
  // A world point in window points (false when behind the camera or outside the rect).
  bool project(glm::vec3 world, glm::vec2* out) const;
  bool animating() const { return animating_; }

 private:
  render::Scene scene_;
  render::Camera camera_;
  ServingGeometry geom_;
  UiRect rect_;
  std::shared_ptr<const ServingSnapshot> built_snapshot_;
  ServingViewOptions built_view_;
  ServingPick pick_;
  bool animating_ = true;
  bool initialized_ = false;
};

}  // namespace kvscope::app
