// serving_scene.h — a serving run's snapshot (app/core/serving_run.h) as a 3D scene: the
// sequences as lanes of tokens, the pool of KV blocks as a grid of tiles under them, the
// lines of a lane's block table to its tiles, and the write heads.
//
// Pure functions of their inputs (the headless capture, the window and the tests build
// identical scenes); ServingView adds the camera, pointer input and picking, as SceneView
// does for the single-sequence view. No ImGui.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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
// Free tiles' and cached (unreferenced) tiles' colours (the latter for the palette entry of
// the sequence that last held it; -1 when not known).
glm::vec3 serving_free_color();
glm::vec3 serving_cached_color(int i);

// Where things are, in world units: lane `k` (the k-th lane drawn) is a row of tokens at
// y = lane_y(k); tile `b` sits at tile_center(b). The scene's tokens are the lanes' tokens
// (in lane order, position order), its kv_blocks the tiles (in block id order).
//
// The layout is one upright plane (z = 0) facing the camera: the lanes on top, one token
// per kServingTokenPitch along +x from x = 0, lane 0 highest, kServingLanePitch apart;
// under them the pool, a grid of `columns` tiles `tile_pitch` apart from x = 0, block 0 top
// left, row by row. The columns depend on the pool's size alone and the rows reserved for
// lanes grow only with the requests, so a tile keeps its slot over a run. The pool spans
// about the lanes' width (at least kServingTilePitch per tile): its scale grows by sqrt(2)
// when the longest lane outgrows it (a few times over a long run), so the whole stays about
// 16:9 and a tile, a page of block_size positions, is always several tokens wide.
inline constexpr int kServingMaxLanes = 24;  // lanes drawn at most (ServingGeometry::lane_seq)
inline constexpr int kServingPrunedLanes = 6;  // pruned beams drawn at most (the newest)
inline constexpr float kServingTokenPitch = 1.0f;
inline constexpr float kServingLanePitch = 2.2f;
inline constexpr float kServingTilePitch = 3.0f;  // the least tile pitch
inline constexpr float kServingTileFill = 0.87f;  // a tile's width over its pitch
inline constexpr float kServingPoolGap = 3.0f;    // between the lowest lane and the pool's top
// How far above its slot a rejected draft's ghost floats (speculative decoding).
inline constexpr float kServingGhostRise = 0.9f;
// The selected lane's attention beams: to its most attended positions, this many at most.
inline constexpr int kServingMaxBeams = 256;

struct ServingGeometry {
  int columns = 1;                       // tiles per grid row
  std::vector<int> lane_seq;             // the sequence drawn in each lane, top first
  int block_size = 16;                   // positions per block (the snapshot's)
  float pool_top = 0.0f;                 // y of the top row's tile centres
  float tile_pitch = kServingTilePitch;  // centre to centre
  float tile_size = kServingTilePitch * kServingTileFill;  // a tile's width and height
  glm::vec3 tile_center(int block) const;
  glm::vec3 token_center(int lane, int pos) const;
  float lane_y(int lane) const;
  glm::vec3 pool_min{0.0f}, pool_max{0.0f};    // the grid's bounds
  glm::vec3 lanes_min{0.0f}, lanes_max{0.0f};  // the lanes' bounds
};
ServingGeometry serving_geometry(const ServingSnapshot& s);
// The lane drawing sequence `seq` (-1: not drawn).
int serving_lane_of(const ServingGeometry& g, int seq);
// Where a fork branched off its parent (Lane::parent): the positions they share. A sample
// (Lane::sample > 0) forks at its prompt's end; a beam (a fork of sample 0) where its
// tokens and its parent's part (the beam step's candidates from one parent differ in
// their token); the prompt's end when the parent is gone. 0 for a lane that is no fork.
int serving_fork_stem(const ServingSnapshot& s, const Lane& l);
// A fork's branch bar (wider than a block boundary's).
inline constexpr float kServingBranchWidth = 0.16f;

// The scene for snapshot `s` (a fresh revision) and its animation for `clock`. What it
// shows (a legend's worth):
//   tokens: generated ones in the lane's colour (serving_color of Lane::color), computed
//     prompt ones a muted version of it, the prefix adopted from the cache pale (toward
//     white), positions not computed yet dark; waiting lanes dim, finished ones dimmer,
//     preempted / cancelled / failed ones grey; a thin bar at each logical block boundary;
//   tiles: used ones their first owner's colour (a partly filled block slightly darker),
//     striped when shared (refs 2), cross-hatched when held three or more times, free ones
//     grey, cached ones dim (serving_cached_color); flashing white when written, adopted
//     from the prefix cache or released this step, white-red when copied on write, red when
//     evicted; the hovered tile lit, with its positions in every lane holding it;
//   the head: the scene's write head on the selected lane (else the first running one), a
//     small amber box in the next slot of every other running lane;
//   forks (samples, beams): a branch bar in the fork's colour from its parent's lane to
//     its own, between the last shared position and its first own one; a beam's shared
//     generated stem faint in its own lane; a pruned beam's lane faded;
//   beams: the selected and hovered lanes' block-table lines (a logical block's tokens to
//     its tile, in the lane's colour), the selected lane's attention from its next slot.
//   blocks going back: with `prev` (the snapshot of the step before, same run), each tile
//     this step released (TileFlash::Released: a sequence finished, was preempted or
//     pruned) that a lane drawn now held in `prev` pours that logical block's tokens back:
//     each position it held flies, a small block in the lane's colour, from its slot in the
//     lane to its slot in the tile (a grid of ceil(sqrt(block_size)) columns), shrinking as
//     it lands (after the ghosts; drawn whatever the level of detail).
render::Scene build_serving_scene(const ServingSnapshot& s, const ServingViewOptions& opts,
                                  const AnimClock& clock, const ServingSnapshot* prev = nullptr);
// Sets only the per-frame parts (scene.anim, the head's glow) for `clock`.
void animate_serving_scene(render::Scene* scene, const AnimClock& clock);

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

// Level of detail of the view's scene (the built one has every token and label): a lane's
// labels are shown while its tokens are at least kServingLabelSpacingPx apart on screen, its
// tokens are drawn (those in view) while at least kServingBarSpacingPx apart, and as flat
// bars, one per run of equal tokens, below that.
inline constexpr float kServingLabelSpacingPx = 10.0f;
inline constexpr float kServingBarSpacingPx = 3.0f;

class ServingView {
 public:
  // Brings the scene and camera up to date (rebuilds only when the snapshot or the options
  // change); the camera frames lanes and pool inside `rect`, and the input orbits, pans and
  // zooms it as in the single-sequence view.
  void update(const ServingFrame& f, const ViewInput& in);
  void draw(render::Renderer& r, int fb_width, int fb_height, float fb_scale);
  // The scene drawn: build_serving_scene's with the level of detail above applied.
  const render::Scene& scene() const { return scene_; }
  const ServingGeometry& geometry() const { return geom_; }
  // What is under the pointer at the last update.
  ServingPick picked() const { return pick_; }
  // A world point in window points (false when behind the camera or outside the rect).
  bool project(glm::vec3 world, glm::vec2* out) const;
  bool animating() const { return animating_; }

 private:
  void frame_camera(const ServingFrame& f, const ViewInput& in);
  void update_detail();
  ServingPick pick_at(float x, float y) const;

  render::Scene scene_;
  ServingGeometry geom_;
  UiRect rect_;
  std::shared_ptr<const ServingSnapshot> built_snapshot_;
  std::shared_ptr<const ServingSnapshot> prev_snapshot_;  // the one drawn before it
  ServingViewOptions built_view_;
  ServingPick pick_;
  // The camera: an orbit framing lanes and pool from a fixed 3/4-front angle, plus what the
  // person changed (kept as offsets, so the framing follows the run and their view stays).
  render::Orbit cur_, goal_;
  float user_yaw_ = 0, user_pitch_ = 0, user_zoom_ = 1;
  glm::vec3 user_pan_{0.0f};
  uint64_t run_ = ~0ull;
  // Level of detail (update_detail): the built scene's tokens and markers, kept whole;
  // the scene drawn holds, per lane, the tokens in view (labelled where they are far
  // enough apart to read), or the lane as a few flat bars (runs of one colour) where its
  // tokens are too close together on screen to tell apart.
  std::vector<render::TokenInstance> full_tokens_;
  std::vector<render::MarkerInstance> full_markers_;
  std::vector<size_t> lane_first_;  // index of each lane's first token in full_tokens_
  std::vector<int> lane_len_;       // tokens in each lane
  std::vector<int> detail_key_;     // per lane: bars?, first/last drawn, first/last labelled
  render::CameraView detailed_for_;
  bool animating_ = true;
  bool initialized_ = false;
};

}  // namespace kvscope::app
