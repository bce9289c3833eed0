// scene.h — the plain data the renderer draws. No engine types, no GL types.
//
// A Scene is built by the app whenever its inputs change and handed to
// render::Renderer::draw() every frame. Per-frame animation lives in SceneAnim (uniforms),
// so an animated frame does not touch the instance data; `revision` tells the renderer
// when the instance data is unchanged and its GPU buffers can be reused. Everything is in world
// units; +x runs along the sequence, +y is up, +z points towards the default (FRONT) camera. Colors
// are linear RGB in [0,1]. Invariants: brightness/weight fields are in [0,1] (the renderer clamps
// them); label text is valid UTF-8 (code points missing from the glyph atlas draw as '?').
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <glm/geometric.hpp>
#include <glm/vec3.hpp>

namespace kvscope::render {

// One token of the sequence: a block with its text floating above it.
struct TokenInstance {
  glm::vec3 position{0.0f};  // block center
  glm::vec3 color{1.0f};
  float brightness = 1.0f;   // 0 = black, 1 = full color; emissive boost above 0.8
  std::string label;         // display text, drawn above the block
  bool highlighted = false;  // hovered / selected: outlined by a brighter tint
  // Labels are world-sized (label_height) but never drawn smaller than this many pixels
  // tall: > 0 keeps a label readable from far away (level of detail for the important
  // tokens); 0 lets it shrink with distance and fade out once too small to read.
  float label_min_px = 0.0f;
  float drop = 0.0f;         // world units above its slot when SceneAnim::fall is 1 (label too)
  // A flat label is drawn horizontal whatever Scene::labels_vertical says, hanging below the
  // token's near (+z) edge in lane `label_lane` (0 nearest, one line further per lane): the
  // readable labels of the most-attended tokens when the camera looks down (TOP).
  bool label_flat = false;
  int label_lane = 0;  // see kFlatLabelGap / kFlatLabelLane
  // World units along +x the token (and its label) starts from when SceneAnim::slide is 1:
  // after a context shift the surviving tokens slide left into their new positions.
  float slide = 0.0f;
  // 1: dropped by this step (a context shift): the block shrinks and sinks away as
  // SceneAnim::leave goes 0 -> 1 (as KvBlockInstance::leave; give it no label).
  float leave = 0.0f;
};

// Flat labels: the gap between the token's near edge and the first lane's line, and the
// distance from one lane to the next, in text lines (the line's height on screen).
inline constexpr float kFlatLabelGap = 0.25f;
inline constexpr float kFlatLabelLane = 1.1f;

// One layer's KV-cache entry of one token: a small block in the stack under the token.
struct KvBlockInstance {
  glm::vec3 position{0.0f};  // block center
  glm::vec3 color{1.0f};
  float brightness = 1.0f;  // 0 = empty slot (drawn dark), 1 = filled
  float recompute = 0.0f;   // 0..1: mixes in the red "being recomputed" flash
  // Added times SceneAnim::flash (results capped at 1): the step-flash of blocks written now.
  float flash_brightness = 0.0f, flash_recompute = 0.0f;
  // Times SceneAnim::flash (capped at 1): how far the block's colour flashes toward white.
  float flash_white = 0.0f;
  float highlight = 0.0f;  // 0..1: lit (e.g. the KV head the selected query head reads)
  // 1: evicted by this step: the block shrinks and sinks away as SceneAnim::leave goes 0 -> 1.
  float leave = 0.0f;
  // Hatching that says the cache stores quantized rows: stripes per world unit, rising for
  // the K rows' type and falling for the V rows' (both: a cross-hatch); 0 = plain (float).
  float hatch_k = 0.0f, hatch_v = 0.0f;
  float slide = 0.0f;  // as TokenInstance::slide
};

// A thin emissive box that marks a place in the scene (a layer's window boundary).
struct MarkerInstance {
  glm::vec3 center{0.0f};
  glm::vec3 size{0.05f};  // full extents
  glm::vec3 color{1.0f};
};

// One attention beam from the write head back to an earlier token.
struct Beam {
  glm::vec3 from{0.0f};
  glm::vec3 to{0.0f};
  float weight = 0.0f;  // 0..1 brightness (the attention weight after display scaling)
  glm::vec3 color{0.55f, 0.85f, 1.0f};
};

// The position being generated: a glowing sphere with an additive halo.
struct WriteHead {
  bool visible = true;
  glm::vec3 position{0.0f};
  float radius = 0.35f;  // world units (what camera framing counts)
  // > 0: the sphere is drawn never smaller than this many pixels in radius (and its halo with
  // it), so the head stays a marker of constant size however far the camera frames the
  // sequence (TOP over hundreds of tokens); close up it keeps its world size.
  float min_px = 0.0f;
  glm::vec3 color{1.0f, 0.85f, 0.45f};
  float glow = 1.0f;  // 0..1 halo strength (the app pulses it while a step runs)
};

// The floor grid under the scene.
struct Grid {
  bool visible = true;
  float height = -5.0f;  // y of the floor plane
  float spacing = 1.0f;  // minor line spacing; every 8th line is brighter
  glm::vec3 color{0.22f, 0.26f, 0.34f};
};

// Where the camera is for this frame (produced by render::Camera).
struct CameraView {
  glm::vec3 eye{0.0f, 2.0f, 20.0f};
  glm::vec3 target{0.0f};
  glm::vec3 up{0.0f, 1.0f, 0.0f};
  float fov_y_deg = 45.0f;
  float near_plane = 0.1f;
  float far_plane = 2000.0f;
};

// The shape of every beam: a quadratic arc from the head to the token whose control point
// sits above the chord's middle by rise + rise_per_span * span and behind it (-z) by
// lean_per_span * span (span = chord length). Its apex is half that offset from the chord.
// From the side the arcs rise; from above (TOP) the lean spreads them into a 2D fan.
struct BeamArc {
  float rise = 0.35f;
  float rise_per_span = 0.16f;
  float lean_per_span = 0.22f;
};

// The highest (and furthest back) point of a beam's arc: the middle of the quadratic arc
// from `from` to `to` (see shaders/beam.vert), half the control point's offset away.
inline glm::vec3 beam_apex(glm::vec3 from, glm::vec3 to, const BeamArc& arc) {
  float span = glm::length(to - from);
  return 0.5f * (from + to) +
         0.5f * glm::vec3(0.0f, arc.rise + arc.rise_per_span * span, -arc.lean_per_span * span);
}

// Per-frame animation, applied in the shaders (never re-uploads instance data).
struct SceneAnim {
  float flash = 0.0f;             // 0..1 multiplier of every KV block's flash_* gains
  float fall = 0.0f;              // 0..1 fraction of each token's `drop` still to fall
  float beam_fade = 1.0f;         // multiplies every beam's weight
  glm::vec3 beam_shift{0.0f};     // added to every beam's origin (follows the head)
  BeamArc beam_arc;               // beam shape (a uniform: presets may change it per frame)
  float leave = 1.0f;             // 0..1 progress of this step's evictions (1: gone)
  float slide = 0.0f;             // 0..1 fraction of each instance's `slide` still to travel
};

// Where the block shader (shaders/block.vert) puts a KV block's or token's center for
// animation `a`: its slide still to travel, its leave (sinking), a token's drop still to fall.
inline glm::vec3 drawn_center(const KvBlockInstance& k, const SceneAnim& a) {
  const float slide = a.slide < 0.0f ? 0.0f : a.slide > 1.0f ? 1.0f : a.slide;
  float leave = k.leave * (a.leave < 0.0f ? 0.0f : a.leave > 1.0f ? 1.0f : a.leave);
  leave = leave < 0.0f ? 0.0f : leave > 1.0f ? 1.0f : leave;
  return k.position + glm::vec3(k.slide * slide, -0.6f * leave, 0.0f);
}
inline glm::vec3 drawn_center(const TokenInstance& t, const SceneAnim& a) {
  KvBlockInstance k;
  k.position = t.position;
  k.slide = t.slide;
  k.leave = t.leave;
  const float fall = a.fall < 0.0f ? 0.0f : a.fall > 1.0f ? 1.0f : a.fall;
  return drawn_center(k, a) + glm::vec3(0.0f, t.drop * fall, 0.0f);
}

struct Scene {
  // Nonzero: the instance content (tokens, labels, kv_blocks, beams, markers, token/kv sizes,
  // label settings) equals that of any earlier Scene with the same revision, so the
  // renderer reuses its buffers. 0: unknown; the renderer repacks and re-uploads only the
  // byte ranges that changed. Make fresh values with next_scene_revision().
  uint64_t revision = 0;
  SceneAnim anim;
  std::vector<TokenInstance> tokens;
  std::vector<KvBlockInstance> kv_blocks;
  std::vector<Beam> beams;
  std::vector<MarkerInstance> markers;
  WriteHead head;
  Grid grid;
  CameraView camera;

  glm::vec3 token_size{0.8f, 0.8f, 0.8f};      // full extents of a token block
  glm::vec3 kv_block_size{0.6f, 0.12f, 0.6f};  // full extents of one KV block
  float label_height = 0.42f;                  // world height of one text line
  float label_fit_px = 11.0f;  // labels grow toward this many pixels while there is room
  bool labels_vertical = true;  // labels read bottom-to-top (no overlap between neighbours)
  // Draw only the tokens, KV blocks and labels in view (when they lie in x order).
  bool cull_offscreen = true;
  // Level of detail for the beams to tokens out of view (when the tokens lie in x order):
  // drawn at their least width, and past the renderer's kOffViewBeams only the strongest of
  // each stretch of the sequence; the beams to tokens in view are all drawn as they are.
  bool beam_lod = true;
  glm::vec3 background{0.035f, 0.04f, 0.06f};
  // 0..1: strength of the depth haze on token and KV blocks (far ones fade toward the
  // background); 0 for a scene that is one flat wall, where depth says nothing.
  float haze = 1.0f;
};

// A rectangle of the framebuffer in pixels, origin at the top-left (window convention).
// The 3D view is drawn into the rectangle the UI panels leave free.
struct Viewport {
  int x = 0, y = 0, width = 0, height = 0;
  float aspect() const { return height > 0 ? float(width) / float(height) : 1.0f; }
  bool contains(float px, float py) const {
    return px >= float(x) && py >= float(y) && px < float(x + width) && py < float(y + height);
  }
};

// A process-wide unique nonzero revision (thread-safe).
uint64_t next_scene_revision();

}  // namespace kvscope::render
