// serving_view.cpp — the Serving view in its rectangle: the scene rebuilt when the snapshot
// or the options change, a camera framing lanes and pool from a fixed 3/4-front angle (the
// person's orbit, pan and zoom kept as offsets to it), labels only where readable, and
// picking of tiles and lanes by where the pointer's ray meets the scene's plane (z = 0).
#include <algorithm>
#include <cmath>

#include <glm/gtc/matrix_transform.hpp>
#include <glm/mat4x4.hpp>

#include "app/scene/serving_scene.h"

namespace kvscope::app {
namespace {

constexpr float kYawDeg = 10.0f, kPitchDeg = 12.0f, kFovDeg = 40.0f;

struct Basis {
  glm::vec3 offset, right, up;  // target -> eye (unit), the view's right and up
};

Basis basis(float yaw_deg, float pitch_deg) {
  const float y = glm::radians(yaw_deg), p = glm::radians(pitch_deg);
  Basis b;
  b.offset = {std::cos(p) * std::sin(y), std::sin(p), std::cos(p) * std::cos(y)};
  b.up = {-std::sin(p) * std::sin(y), std::cos(p), -std::sin(p) * std::cos(y)};
  b.right = glm::normalize(glm::cross(b.up, b.offset));
  return b;
}

render::CameraView view_of(const render::Orbit& o, float extent) {
  const Basis bs = basis(o.yaw_deg, o.pitch_deg);
  render::CameraView v;
  v.target = o.target;
  v.eye = o.target + bs.offset * o.distance;
  v.up = bs.up;
  v.fov_y_deg = kFovDeg;
  v.near_plane = std::max(0.05f, o.distance * 0.01f);
  v.far_plane = o.distance * 4.0f + extent + 100.0f;
  return v;
}

// The orbit at (yaw, pitch) whose view of `aspect` holds the box [lo, hi].
render::Orbit frame_box(glm::vec3 lo, glm::vec3 hi, float yaw, float pitch, float aspect) {
  render::Orbit o;
  o.yaw_deg = yaw;
  o.pitch_deg = pitch;
  o.target = 0.5f * (lo + hi);
  const Basis bs = basis(yaw, pitch);
  const float tan_y = std::tan(glm::radians(kFovDeg) * 0.5f), tan_x = tan_y * aspect;
  float dist = 1.0f;
  for (int i = 0; i < 8; ++i) {
    const glm::vec3 c{(i & 1) ? hi.x : lo.x, (i & 2) ? hi.y : lo.y, (i & 4) ? hi.z : lo.z};
    const glm::vec3 r = c - o.target;
    const float x = std::abs(glm::dot(r, bs.right)), y = std::abs(glm::dot(r, bs.up));
    const float z = glm::dot(r, bs.offset);
    dist = std::max({dist, z + x / tan_x, z + y / tan_y});
  }
  o.distance = dist * 1.04f + 0.5f;
  return o;
}

bool same_view(const render::CameraView& a, const render::CameraView& b) {
  return a.eye == b.eye && a.target == b.target && a.up == b.up;
}

}  // namespace

void ServingView::update(const ServingFrame& f, const ViewInput& in) {
  rect_ = f.rect;
  const bool rebuild = !initialized_ || f.snapshot != built_snapshot_ || !(f.view == built_view_);
  if (rebuild) {
    scene_ = render::Scene{};
    // Before the first step there is nothing being written: no head (a default one would
    // glow at the origin, filling the empty view).
    scene_.head.visible = false;
    geom_ = ServingGeometry{};
    if (f.snapshot) {
      // The snapshot drawn before this one (the step before, when played forward): what
      // this step released flies back (a rebuild for new options keeps it).
      if (built_snapshot_ != f.snapshot) prev_snapshot_ = built_snapshot_;
      scene_ = build_serving_scene(*f.snapshot, f.view, f.clock, prev_snapshot_.get());
      geom_ = serving_geometry(*f.snapshot);
      if (f.snapshot->run != run_) {  // a new run is framed afresh
        user_yaw_ = user_pitch_ = 0.0f;
        user_zoom_ = 1.0f;
        user_pan_ = glm::vec3(0.0f);
        run_ = f.snapshot->run;
        initialized_ = false;
      }
    }
    built_snapshot_ = f.snapshot;
    built_view_ = f.view;
    // The level of detail draws from the whole content from here on.
    full_tokens_ = std::move(scene_.tokens);
    full_markers_ = std::move(scene_.markers);
    scene_.tokens.clear();
    scene_.markers.clear();
    lane_first_.assign(geom_.lane_seq.size(), 0);
    lane_len_.assign(geom_.lane_seq.size(), 0);
    size_t first = 0;
    for (size_t k = 0; k < geom_.lane_seq.size() && f.snapshot; ++k)
      for (const Lane& l : f.snapshot->lanes)
        if (l.seq == geom_.lane_seq[k]) {
          lane_first_[k] = first;
          lane_len_[k] = int(l.ids.size());
          first += l.ids.size();
        }
    detail_key_.clear();
  } else {
    animate_serving_scene(&scene_, f.clock);
  }
  frame_camera(f, in);
  update_detail();
  pick_ = in.hover ? pick_at(in.mouse_x, in.mouse_y) : ServingPick{};
  animating_ = f.clock.since_step < 1.5 || f.clock.busy ||
               glm::length(cur_.target - goal_.target) > 0.002f * goal_.distance ||
               std::abs(cur_.distance - goal_.distance) > 0.002f * goal_.distance ||
               std::abs(cur_.yaw_deg - goal_.yaw_deg) > 0.05f ||
               std::abs(cur_.pitch_deg - goal_.pitch_deg) > 0.05f;
}

void ServingView::frame_camera(const ServingFrame& f, const ViewInput& in) {
  const float aspect = rect_.h > 0 ? rect_.w / rect_.h : 16.0f / 9.0f;
  // What is framed: the lanes with room for their labels above, and the pool.
  glm::vec3 lo = glm::min(geom_.lanes_min, geom_.pool_min);
  glm::vec3 hi = glm::max(geom_.lanes_max, geom_.pool_max) + glm::vec3(0.0f, 1.2f, 0.0f);
  render::Orbit framed = frame_box(lo, hi, kYawDeg, kPitchDeg, aspect);
  // The person's input, as offsets to the framing.
  const Basis bs = basis(framed.yaw_deg + user_yaw_, framed.pitch_deg + user_pitch_);
  const float dist = framed.distance * user_zoom_;
  const float tan_y = std::tan(glm::radians(kFovDeg) * 0.5f);
  if (in.orbit) {
    user_yaw_ -= in.dx * 0.3f;
    user_pitch_ = std::clamp(user_pitch_ + in.dy * 0.3f, -kPitchDeg - 60.0f, 89.0f - kPitchDeg);
  }
  if (in.pan && rect_.h > 0) {
    const float h = 2.0f * dist * tan_y;
    user_pan_ += (-in.dx / rect_.h * bs.right + in.dy / rect_.h * bs.up) * h;
  }
  if (in.hover && in.wheel != 0 && rect_.w > 0 && rect_.h > 0) {
    // Toward the point under the pointer: it stays under the pointer.
    const glm::vec2 ndc{(in.mouse_x - rect_.x) / rect_.w * 2.0f - 1.0f,
                        1.0f - (in.mouse_y - rect_.y) / rect_.h * 2.0f};
    const float k = std::pow(0.88f, in.wheel);
    const float nz = std::clamp(user_zoom_ * k, 0.02f, 20.0f);
    const float shrink = 1.0f - nz / user_zoom_;
    user_pan_ += shrink * dist * (bs.right * (ndc.x * tan_y * aspect) + bs.up * (ndc.y * tan_y));
    user_zoom_ = nz;
  }
  goal_ = framed;
  goal_.yaw_deg += user_yaw_;
  goal_.pitch_deg += user_pitch_;
  goal_.distance *= user_zoom_;
  goal_.target += user_pan_;
  if (!initialized_ || f.dt <= 0) {
    cur_ = goal_;
    initialized_ = true;
  } else {
    const float a = 1.0f - std::exp(-8.0f * f.dt);
    cur_.target += (goal_.target - cur_.target) * a;
    cur_.yaw_deg += (goal_.yaw_deg - cur_.yaw_deg) * a;
    cur_.pitch_deg += (goal_.pitch_deg - cur_.pitch_deg) * a;
    cur_.distance *= std::pow(goal_.distance / cur_.distance, a);
  }
  scene_.camera = view_of(cur_, glm::length(hi - lo));
}

void ServingView::update_detail() {
  if (!detail_key_.empty() && same_view(scene_.camera, detailed_for_)) return;
  detailed_for_ = scene_.camera;
  // Per lane: the first and last positions in the rectangle, and of those far enough apart
  // on screen to read; the widest spacing on screen of the ones in view.
  const size_t n_lanes = lane_len_.size();
  std::vector<int> key(n_lanes * 5, -1);
  const render::Viewport vp{int(rect_.x), int(rect_.y), int(rect_.w), int(rect_.h)};
  const float margin = 24.0f;
  for (size_t k = 0; k < n_lanes; ++k) {
    float widest = 0.0f;
    int* lane_key = &key[k * 5];
    for (int pos = 0; pos < lane_len_[k]; ++pos) {
      const glm::vec3 at = full_tokens_[lane_first_[k] + size_t(pos)].position;
      auto p = render::project_to_viewport(scene_.camera, at, vp);
      if (!p || p->x < rect_.x - margin || p->x > rect_.right() + margin ||
          p->y < rect_.y - margin || p->y > rect_.bottom() + margin)
        continue;
      auto q =
          render::project_to_viewport(scene_.camera, at + glm::vec3(kServingTokenPitch, 0, 0), vp);
      const float spacing = q ? glm::length(*q - *p) : 0.0f;
      widest = std::max(widest, spacing);
      if (lane_key[1] < 0) lane_key[1] = pos;
      lane_key[2] = pos;
      if (spacing >= kServingLabelSpacingPx) {
        if (lane_key[3] < 0) lane_key[3] = pos;
        lane_key[4] = pos;
      }
    }
    lane_key[0] = widest < kServingBarSpacingPx ? 1 : 0;
  }
  key.push_back(0);  // never empty once computed
  if (key == detail_key_) return;
  detail_key_ = key;

  scene_.tokens.clear();
  scene_.markers = full_markers_;
  for (size_t k = 0; k < n_lanes; ++k) {
    const int* lane_key = &key[k * 5];
    const size_t first = lane_first_[k];
    if (lane_key[0] == 1) {
      // Bars: one flat box per run of tokens that look alike (a lane's cached prefix, its
      // prompt, what it generated), shaded as the blocks would be.
      int run = 0;
      for (int pos = 1; pos <= lane_len_[k]; ++pos) {
        const render::TokenInstance& a = full_tokens_[first + size_t(run)];
        if (pos < lane_len_[k]) {
          const render::TokenInstance& b = full_tokens_[first + size_t(pos)];
          if (b.color == a.color && b.brightness == a.brightness && b.highlighted == a.highlighted)
            continue;
        }
        const glm::vec3 p0 = a.position, p1 = full_tokens_[first + size_t(pos - 1)].position;
        render::MarkerInstance m;
        m.center = 0.5f * (p0 + p1);
        m.size = {p1.x - p0.x + 0.9f * kServingTokenPitch, scene_.token_size.y,
                  scene_.token_size.z};
        const float b = std::clamp(a.brightness, 0.0f, 1.0f);
        m.color = (a.highlighted ? glm::vec3(1.0f, 0.95f, 0.55f) : a.color) * (0.15f + 0.7f * b);
        scene_.markers.push_back(m);
        run = pos;
      }
      continue;
    }
    if (lane_key[1] < 0) continue;  // nothing of it in view
    for (int pos = lane_key[1]; pos <= lane_key[2]; ++pos) {
      render::TokenInstance t = full_tokens_[first + size_t(pos)];
      if (pos < lane_key[3] || pos > lane_key[4]) t.label.clear();
      scene_.tokens.push_back(std::move(t));
    }
  }
  // After the lanes' tokens: the rejected drafts' ghosts, always drawn.
  const size_t lanes_end = n_lanes > 0 ? lane_first_[n_lanes - 1] + size_t(lane_len_[n_lanes - 1]) : 0;
  for (size_t i = lanes_end; i < full_tokens_.size(); ++i) scene_.tokens.push_back(full_tokens_[i]);
  scene_.revision = render::next_scene_revision();
}

ServingPick ServingView::pick_at(float x, float y) const {
  ServingPick pick;
  if (!rect_.contains(x, y) || rect_.w <= 0 || rect_.h <= 0) return pick;
  // The pointer's ray, where it meets the plane z = 0 the lanes and tiles stand in.
  const render::CameraView& v = scene_.camera;
  const glm::mat4 inv =
      glm::inverse(render::projection_matrix(v, rect_.w / rect_.h) * render::view_matrix(v));
  const glm::vec2 ndc{(x - rect_.x) / rect_.w * 2.0f - 1.0f, 1.0f - (y - rect_.y) / rect_.h * 2.0f};
  glm::vec4 a = inv * glm::vec4(ndc, -1.0f, 1.0f), b = inv * glm::vec4(ndc, 1.0f, 1.0f);
  const glm::vec3 p0 = glm::vec3(a) / a.w, p1 = glm::vec3(b) / b.w;
  if (std::abs(p1.z - p0.z) < 1e-6f) return pick;
  const float t = -p0.z / (p1.z - p0.z);
  if (t < 0.0f) return pick;
  const glm::vec3 hit = p0 + t * (p1 - p0);
  // A tile: the column and row under the hit, inside the tile's face.
  const int n_tiles = int(scene_.kv_blocks.size());
  const int col = int(std::floor(hit.x / geom_.tile_pitch));
  const int row = int(std::lround((geom_.pool_top - hit.y) / geom_.tile_pitch));
  if (col >= 0 && col < geom_.columns && row >= 0) {
    const int block = row * geom_.columns + col;
    const glm::vec3 c = block < n_tiles ? geom_.tile_center(block) : glm::vec3(0.0f);
    if (block < n_tiles && std::abs(hit.x - c.x) <= 0.5f * geom_.tile_size &&
        std::abs(hit.y - c.y) <= 0.5f * geom_.tile_size)
      pick.tile = block;
  }
  // A lane: the row of tokens under the hit (its tokens and its next slot).
  const int lane = int(std::lround(-hit.y / kServingLanePitch));
  if (lane >= 0 && lane < int(geom_.lane_seq.size()) &&
      std::abs(hit.y - geom_.lane_y(lane)) <= 0.4f * kServingLanePitch) {
    const int n = lane_len_[size_t(lane)];
    const int pos = int(std::lround(hit.x / kServingTokenPitch));
    if (pos >= 0 && pos <= n) {
      pick.seq = geom_.lane_seq[size_t(lane)];
      pick.pos = pos < n ? pos : -1;
    }
  }
  return pick;
}

bool ServingView::project(glm::vec3 world, glm::vec2* out) const {
  const render::Viewport vp{int(rect_.x), int(rect_.y), int(rect_.w), int(rect_.h)};
  auto p = render::project_to_viewport(scene_.camera, world, vp);
  if (!p || !rect_.contains(p->x, p->y)) return false;
  if (out) *out = *p;
  return true;
}

void ServingView::draw(render::Renderer& r, int fb_width, int fb_height, float fb_scale) {
  r.draw(scene_, fb_width, fb_height, to_viewport(rect_, fb_scale));
}

}  // namespace kvscope::app
