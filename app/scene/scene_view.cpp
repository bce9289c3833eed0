// scene_view.cpp — scene caching, camera framing for the free rectangle, picking.
#include "app/scene/scene_view.h"

#include <algorithm>
#include <cmath>

#include "render/layout.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

render::Viewport to_viewport(UiRect rect, float fb_scale) {
  int x0 = int(std::lround(rect.x * fb_scale)), y0 = int(std::lround(rect.y * fb_scale));
  int x1 = int(std::lround(rect.right() * fb_scale)),
      y1 = int(std::lround(rect.bottom() * fb_scale));
  return {x0, y0, std::max(x1 - x0, 1), std::max(y1 - y0, 1)};
}

int pick_token(const render::Scene& s, UiRect rect, float x, float y, float radius) {
  if (!rect.contains(x, y)) return -1;
  int best = -1;
  float best_d = radius * radius;
  render::Viewport vp{int(rect.x), int(rect.y), int(rect.w), int(rect.h)};
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    auto p = render::project_to_viewport(s.camera, s.tokens[i].position, vp);
    if (!p) continue;
    float dx = p->x - x, dy = p->y - y, d = dx * dx + dy * dy;
    if (d < best_d) {
      best_d = d;
      best = int(i);
    }
  }
  return best;
}

void SceneView::update(const ViewFrame& f, const ViewInput& in) {
  const Timeline& tl = *f.timeline;
  rect_ = f.rect;
  // Scrubbing the history changes the viewed step alone: the scene is that step's.
  const int viewed = tl.live() ? 0 : tl.viewed_step();
  // A new run (Reset, another model or KV type) starts at position 0, wherever the person
  // had zoomed or panned to: the preset frames it at once, so the view is never left empty.
  const bool new_run = built_.valid && built_.run != tl.run();
  if (!built_.valid || built_.run != tl.run() || built_.steps != tl.steps().size() ||
      built_.tokens != tl.tokens().size() || built_.viewed != viewed || !(built_.view == f.view)) {
    label_priority_.clear();
    scene_ = render::Scene{};  // the old instances go first: one copy at a time in memory
    scene_ = build_scene(tl, f.view, f.clock, &label_priority_);
    built_ = {tl.run(), tl.steps().size(), tl.tokens().size(), viewed, f.view, true};
    flat_px_ = -1.0f;
  } else {
    animate_scene(&scene_, tl, f.clock);
  }

  // The beams' shape eases toward the preset's (TOP spreads them into a flat fan).
  const render::BeamArc goal_arc = render::preset_beam_arc(f.preset);
  const float ease = f.dt > 0 ? 1.0f - std::exp(-6.0f * f.dt) : 1.0f;
  if (!initialized_) arc_ = goal_arc;
  arc_.rise += (goal_arc.rise - arc_.rise) * ease;
  arc_.rise_per_span += (goal_arc.rise_per_span - arc_.rise_per_span) * ease;
  arc_.lean_per_span += (goal_arc.lean_per_span - arc_.lean_per_span) * ease;
  scene_.anim.beam_arc = arc_;

  // Framing for the free rectangle: its aspect, the preset's content, the floor.
  camera_.set_aspect(rect_.h > 0 ? rect_.w / rect_.h : 1.0f);
  camera_.set_ground(scene_.grid.height);
  camera_.set_content(render::framing_content(scene_, goal_arc));
  if (f.preset_changed || !initialized_ || new_run) {
    camera_.set_preset(f.preset, /*instant=*/!initialized_ || new_run || f.dt <= 0);
    initialized_ = true;
  }
  // Pointer: orbit, pan and zoom only when the pointer is in the view (not on a panel).
  if (in.orbit) camera_.orbit(-in.dx * 0.3f, in.dy * 0.3f);
  if (in.pan) camera_.pan(in.dx / std::max(rect_.h, 1.0f), in.dy / std::max(rect_.h, 1.0f));
  if (in.hover && in.wheel != 0 && rect_.w > 0 && rect_.h > 0) {
    glm::vec2 ndc{(in.mouse_x - rect_.x) / rect_.w * 2.0f - 1.0f,
                  1.0f - (in.mouse_y - rect_.y) / rect_.h * 2.0f};
    camera_.zoom_at(in.wheel, ndc);
  }
  if (f.look_at_pos >= 0) camera_.look_at_x(render::layout::token_position(f.look_at_pos).x);
  camera_.update(f.dt);
  scene_.camera = camera_.view();
  update_flat_labels();

  hovered_ = in.hover ? pick_token(scene_, rect_, in.mouse_x, in.mouse_y) : -1;
  shown_first_ = shown_last_ = -1;
  render::Viewport vp{int(rect_.x), int(rect_.y), int(rect_.w), int(rect_.h)};
  for (size_t i = 0; i < scene_.tokens.size(); ++i) {
    auto p = render::project_to_viewport(scene_.camera, scene_.tokens[i].position, vp);
    if (!p || !rect_.contains(p->x, p->y)) continue;
    if (shown_first_ < 0) shown_first_ = int(i);
    shown_last_ = int(i);
  }
  animating_ = !camera_.settled() || f.clock.since_step < 1.5 || f.clock.busy ||
               std::abs(arc_.lean_per_span - goal_arc.lean_per_span) > 1e-3f;
}

void SceneView::update_flat_labels() {
  float ppt = -1.0f;  // token spacing on screen, pixels
  if (camera_.current().pitch_deg >= kFlatPitchDeg && scene_.tokens.size() >= 2 && rect_.h > 0) {
    render::Viewport vp{0, 0, int(rect_.w), int(rect_.h)};
    const glm::vec3 a = scene_.tokens.front().position, b = scene_.tokens.back().position;
    auto pa = render::project_to_viewport(scene_.camera, a, vp);
    auto pb = render::project_to_viewport(scene_.camera, b, vp);
    if (pa && pb && b.x > a.x)
      ppt = glm::length(*pb - *pa) / ((b.x - a.x) / render::layout::kTokenSpacing);
  }
  const bool had = flat_px_ > 0.0f, want = ppt > 0.0f;
  if (had == want && (!want || (ppt < flat_px_ * kFlatRelayout && ppt > flat_px_ / kFlatRelayout)))
    return;
  if (want)
    place_flat_labels(&scene_, label_priority_, ppt);
  else
    for (render::TokenInstance& t : scene_.tokens) t.label_flat = false;
  flat_px_ = want ? ppt : -1.0f;
  scene_.revision = render::next_scene_revision();
}

void SceneView::draw(render::Renderer& r, int fb_width, int fb_height, float fb_scale) {
  r.draw(scene_, fb_width, fb_height, to_viewport(rect_, fb_scale));
}

}  // namespace kvscope::app
