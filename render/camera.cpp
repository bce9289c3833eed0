// camera.cpp — orbit camera math, presets and framing.
#include "render/camera.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include <glm/gtc/matrix_transform.hpp>

namespace kvscope::render {
namespace {

struct Basis {
  glm::vec3 offset;  // unit vector from target to eye
  glm::vec3 right, up;
};

Basis basis(float yaw_deg, float pitch_deg) {
  float y = glm::radians(yaw_deg), p = glm::radians(pitch_deg);
  Basis b;
  b.offset = {std::cos(p) * std::sin(y), std::sin(p), std::cos(p) * std::cos(y)};
  // d(offset)/d(pitch): always perpendicular to offset, never degenerate.
  b.up = {-std::sin(p) * std::sin(y), std::cos(p), -std::sin(p) * std::cos(y)};
  b.right = glm::normalize(glm::cross(b.up, b.offset));
  return b;
}

float wrap_degrees(float a) {
  a = std::fmod(a + 180.0f, 360.0f);
  if (a < 0) a += 360.0f;
  return a - 180.0f;
}

}  // namespace

const char* camera_preset_name(CameraPreset p) {
  switch (p) {
    case CameraPreset::Top:
      return "top";
    case CameraPreset::Side:
      return "side";
    case CameraPreset::Front:
      return "front";
    case CameraPreset::ThreeQuarter:
      return "3/4";
    case CameraPreset::Follow:
      return "follow";
  }
  return "?";
}

std::optional<CameraPreset> parse_camera_preset(std::string_view s) {
  std::string t;
  for (char c : s) t += char(std::tolower(static_cast<unsigned char>(c)));
  if (t == "top") return CameraPreset::Top;
  if (t == "side") return CameraPreset::Side;
  if (t == "front") return CameraPreset::Front;
  if (t == "3/4" || t == "34" || t == "three-quarter" || t == "threequarter")
    return CameraPreset::ThreeQuarter;
  if (t == "follow") return CameraPreset::Follow;
  return std::nullopt;
}

Camera::Camera() {
  goal_ = framed(preset_);
  cur_ = goal_;
}

Orbit Camera::preset_orbit(CameraPreset p) const {
  Orbit o;
  switch (p) {
    case CameraPreset::Top:
      o.yaw_deg = 0;
      o.pitch_deg = 90;
      break;
    // SIDE: the sequence in profile. FRONT: facing the write head, looking back along it.
    case CameraPreset::Side:
      o.yaw_deg = 0;
      o.pitch_deg = 5;
      break;
    case CameraPreset::Front:
      o.yaw_deg = 68;
      o.pitch_deg = 18;
      break;
    case CameraPreset::ThreeQuarter:
      o.yaw_deg = 32;
      o.pitch_deg = 24;
      break;
    case CameraPreset::Follow:
      o.yaw_deg = 22;
      o.pitch_deg = 16;
      break;
  }
  return o;
}

namespace {

// Grows `b` to hold `p`; an empty box (min > max) takes `p` as it is.
void grow(Bounds* b, glm::vec3 p) {
  b->min = glm::min(b->min, p);
  b->max = glm::max(b->max, p);
}

Bounds empty_bounds() {
  return {glm::vec3(1e30f), glm::vec3(-1e30f)};
}

bool is_empty(const Bounds& b) {
  return b.min.x > b.max.x;
}

// Never frame less than `w` units of the sequence, so a short one is not a close-up.
void min_width(Bounds* b, float w) {
  if (b->max.x - b->min.x < w) b->max.x = b->min.x + w;
}

}  // namespace

BeamArc preset_beam_arc(CameraPreset p) {
  BeamArc arc;
  // From straight above, a chord of span s bows back by lean * s / 2: a lean near 1 gives
  // the nested half-ellipses of an arc diagram, with room between beams of close spans.
  if (p == CameraPreset::Top) arc.lean_per_span = 0.9f;
  return arc;
}

FramingContent framing_content(const Scene& s, const BeamArc& arc, float window,
                               float follow_window) {
  FramingContent c;
  c.head = s.head.position;
  c.all = c.recent = c.follow = empty_bounds();
  const float recent_x0 = c.head.x - std::max(window, 4.0f);
  const float follow_x0 = c.head.x - std::max(follow_window, 2.0f);
  const glm::vec3 half = 0.5f * s.token_size;
  // Tokens with their labels above and their KV stacks down to the floor.
  const float label_room = s.labels_vertical ? 3.0f : 1.0f;
  for (const TokenInstance& t : s.tokens) {
    glm::vec3 lo = t.position - half, hi = t.position + half + glm::vec3(0, label_room, 0);
    lo.y = std::min(lo.y, s.grid.height);
    for (Bounds* b : {&c.all, &c.recent, &c.follow}) {
      if (b == &c.recent && t.position.x < recent_x0) continue;
      if (b == &c.follow && t.position.x < follow_x0) continue;
      grow(b, lo);
      grow(b, hi);
    }
  }
  // The head and its halo.
  const float halo = s.head.visible ? s.head.radius * 4.0f : 0.5f;
  for (Bounds* b : {&c.all, &c.recent, &c.follow}) {
    grow(b, c.head - glm::vec3(halo));
    grow(b, c.head + glm::vec3(halo));
    grow(b, glm::vec3(c.head.x, s.grid.height, 0.0f));
  }
  // Beams: the apex of each arc (the chord's ends are tokens and the head, already in).
  for (const Beam& bm : s.beams) {
    if (bm.weight <= 0.004f) continue;  // not drawn
    glm::vec3 apex = beam_apex(bm.from + s.anim.beam_shift, bm.to, arc);
    grow(&c.all, apex);
    if (bm.to.x >= recent_x0) grow(&c.recent, apex);
  }
  min_width(&c.all, 12.0f);
  min_width(&c.recent, 12.0f);
  return c;
}

Orbit Camera::framed(CameraPreset p) const {
  Orbit o = preset_orbit(p);
  const Bounds& b = p == CameraPreset::Top      ? content_.all
                    : p == CameraPreset::Follow ? content_.follow
                                                : content_.recent;
  if (p == CameraPreset::Follow) {
    o.yaw_deg += follow_yaw_;
    o.pitch_deg = std::clamp(o.pitch_deg + follow_pitch_, -89.9f, 90.0f);
  }
  glm::vec3 center = 0.5f * (b.min + b.max);
  Basis bs = basis(o.yaw_deg, o.pitch_deg);
  float tan_y = std::tan(glm::radians(fov_y_deg_) * 0.5f);
  float tan_x = tan_y * aspect_;
  float dist = 1.0f;
  for (int i = 0; i < 8; ++i) {
    glm::vec3 c{(i & 1) ? b.max.x : b.min.x, (i & 2) ? b.max.y : b.min.y,
                (i & 4) ? b.max.z : b.min.z};
    glm::vec3 r = c - center;
    float x = std::abs(glm::dot(r, bs.right)), y = std::abs(glm::dot(r, bs.up));
    float z = glm::dot(r, bs.offset);  // towards the eye
    dist = std::max({dist, z + x / tan_x, z + y / tan_y});
  }
  o.target = center;
  o.distance = dist * 1.06f + 0.5f;
  if (p == CameraPreset::Follow) o.distance = std::clamp(o.distance * follow_zoom_, 0.5f, 5000.0f);
  keep_above_ground(&o);
  return o;
}

void Camera::keep_above_ground(Orbit* o) const {
  if (ground_ < -1e8f) return;
  const float min_eye = ground_ + 0.3f;
  o->target.y = std::max(o->target.y, ground_);
  float eye_y = o->target.y + o->distance * std::sin(glm::radians(o->pitch_deg));
  if (eye_y >= min_eye) return;
  float s = std::clamp((min_eye - o->target.y) / std::max(o->distance, 1e-3f), -1.0f, 1.0f);
  o->pitch_deg = std::max(o->pitch_deg, glm::degrees(std::asin(s)));
}

void Camera::set_preset(CameraPreset p, bool instant) {
  preset_ = p;
  auto_framing_ = true;
  follow_yaw_ = follow_pitch_ = 0.0f;
  follow_zoom_ = 1.0f;
  goal_ = framed(p);
  // Take the short way round.
  cur_.yaw_deg = goal_.yaw_deg + wrap_degrees(cur_.yaw_deg - goal_.yaw_deg);
  if (instant) {
    cur_ = goal_;
    transition_ = -1.0f;
  } else {
    from_ = cur_;
    transition_ = 0.0f;
  }
}

void Camera::set_content(const Bounds& content, glm::vec3 head, float window) {
  FramingContent c;
  c.head = head;
  c.all = content;
  c.recent = content;
  window = std::max(window, 4.0f);
  if (c.recent.max.x - c.recent.min.x > window) {
    c.recent.max.x = std::max(head.x + 1.0f, c.recent.min.x + 1.0f);
    c.recent.min.x = std::max(c.recent.min.x, c.recent.max.x - window);
  }
  c.follow = content;
  c.follow.min.x = head.x - 9.0f;
  c.follow.max.x = head.x + 1.5f;
  set_content(c);
}

void Camera::set_content(const FramingContent& content) {
  content_ = content;
  if (auto_framing_) goal_ = framed(preset_);
}

bool Camera::follow_tracking() const {
  return auto_framing_ && preset_ == CameraPreset::Follow;
}

void Camera::orbit(float d_yaw_deg, float d_pitch_deg) {
  transition_ = -1.0f;  // the user takes over from where the camera is
  if (follow_tracking()) {  // keep tracking the head from the new angle
    follow_yaw_ += d_yaw_deg;
    follow_pitch_ = std::clamp(follow_pitch_ + d_pitch_deg, -100.0f, 80.0f);
    goal_ = framed(preset_);
    return;
  }
  auto_framing_ = false;
  goal_.yaw_deg += d_yaw_deg;
  goal_.pitch_deg = std::clamp(goal_.pitch_deg + d_pitch_deg, -89.9f, 90.0f);
  keep_above_ground(&goal_);
}

void Camera::pan(float dx, float dy) {
  transition_ = -1.0f;  // the user takes over from where the camera is
  auto_framing_ = false;
  Basis bs = basis(goal_.yaw_deg, goal_.pitch_deg);
  float h = 2.0f * goal_.distance * std::tan(glm::radians(fov_y_deg_) * 0.5f);
  goal_.target += (-dx * bs.right + dy * bs.up) * h;
  keep_above_ground(&goal_);
}

void Camera::zoom(float steps) {
  zoom_at(steps, glm::vec2(0.0f));
}

void Camera::zoom_at(float steps, glm::vec2 ndc) {
  transition_ = -1.0f;  // the user takes over from where the camera is
  const float f = std::pow(0.88f, steps);
  if (follow_tracking()) {  // FOLLOW zooms about the head it tracks
    follow_zoom_ = std::clamp(follow_zoom_ * f, 0.05f, 50.0f);
    goal_ = framed(preset_);
    return;
  }
  auto_framing_ = false;
  const float dist = std::clamp(goal_.distance * f, 0.5f, 5000.0f);
  const float k = 1.0f - dist / goal_.distance;
  // The point under the pointer on the plane through the target facing the camera stays
  // under the pointer: the target moves toward it by the fraction the distance shrinks.
  Basis bs = basis(goal_.yaw_deg, goal_.pitch_deg);
  float tan_y = std::tan(glm::radians(fov_y_deg_) * 0.5f), tan_x = tan_y * aspect_;
  glm::vec3 toward = bs.right * (ndc.x * tan_x) + bs.up * (ndc.y * tan_y);
  goal_.target += k * goal_.distance * toward;
  goal_.distance = dist;
  keep_above_ground(&goal_);
}

void Camera::look_at_x(float x) {
  transition_ = -1.0f;  // the user takes over from where the camera is
  auto_framing_ = false;
  goal_.target.x = x;
}

bool Camera::settled() const {
  if (transition_ >= 0.0f) return false;
  float scale = std::max(goal_.distance, 1.0f);
  return glm::length(cur_.target - goal_.target) < 0.002f * scale &&
         std::abs(cur_.yaw_deg - goal_.yaw_deg) < 0.05f &&
         std::abs(cur_.pitch_deg - goal_.pitch_deg) < 0.05f &&
         std::abs(cur_.distance - goal_.distance) < 0.002f * scale;
}

void Camera::update(float dt) {
  if (dt <= 0.0f) {
    cur_ = goal_;
    transition_ = -1.0f;
    return;
  }
  if (transition_ >= 0.0f) {
    // A preset change: ease in and out over a fixed time (no jump on the first frame
    // however far the goal is), toward the goal as it is now (framing may move it).
    transition_ = std::min(transition_ + dt / kTransitionSeconds, 1.0f);
    float x = transition_, k = x * x * x * (x * (x * 6.0f - 15.0f) + 10.0f);
    cur_.target = from_.target + (goal_.target - from_.target) * k;
    float yaw_to = from_.yaw_deg + wrap_degrees(goal_.yaw_deg - from_.yaw_deg);
    cur_.yaw_deg = from_.yaw_deg + (yaw_to - from_.yaw_deg) * k;
    cur_.pitch_deg = from_.pitch_deg + (goal_.pitch_deg - from_.pitch_deg) * k;
    cur_.distance = from_.distance * std::pow(goal_.distance / from_.distance, k);
    keep_above_ground(&cur_);
    if (transition_ >= 1.0f) transition_ = -1.0f;
    return;
  }
  cur_.yaw_deg = goal_.yaw_deg + wrap_degrees(cur_.yaw_deg - goal_.yaw_deg);
  // Following a moving goal (new steps, the user's input): exponential, ~0.5 s to settle.
  float a = 1.0f - std::exp(-6.0f * dt);
  cur_.target += (goal_.target - cur_.target) * a;
  cur_.yaw_deg += (goal_.yaw_deg - cur_.yaw_deg) * a;
  cur_.pitch_deg += (goal_.pitch_deg - cur_.pitch_deg) * a;
  // Zoom in log space so large jumps feel even.
  cur_.distance *= std::pow(goal_.distance / cur_.distance, a);
  keep_above_ground(&cur_);  // both ends are above it; the way between must be too
}

CameraView Camera::view() const {
  Basis bs = basis(cur_.yaw_deg, cur_.pitch_deg);
  CameraView v;
  v.target = cur_.target;
  v.eye = cur_.target + bs.offset * cur_.distance;
  v.up = bs.up;
  v.fov_y_deg = fov_y_deg_;
  v.near_plane = std::max(0.05f, cur_.distance * 0.01f);
  float extent = is_empty(content_.all) ? 0.0f : glm::length(content_.all.max - content_.all.min);
  v.far_plane = cur_.distance * 4.0f + extent + 100.0f;
  return v;
}

glm::mat4 view_matrix(const CameraView& v) {
  return glm::lookAt(v.eye, v.target, v.up);
}

glm::mat4 projection_matrix(const CameraView& v, float aspect) {
  return glm::perspective(glm::radians(v.fov_y_deg), aspect, v.near_plane, v.far_plane);
}

float head_drawn_radius(const Scene& s, float height_px) {
  const WriteHead& h = s.head;
  if (h.min_px <= 0.0f || height_px <= 0.0f) return h.radius;
  const CameraView& v = s.camera;
  const glm::vec3 ahead = v.target - v.eye;
  if (glm::dot(ahead, ahead) <= 0.0f) return h.radius;
  // Pixels per world unit at the head's depth: the perspective's focal length over depth.
  const float depth = glm::dot(h.position - v.eye, glm::normalize(ahead));
  if (depth <= v.near_plane) return h.radius;
  const float focal_px = 0.5f * height_px / std::tan(glm::radians(v.fov_y_deg) * 0.5f);
  return std::max(h.radius, h.min_px * depth / focal_px);
}

std::optional<glm::vec2> project_to_screen(const CameraView& v, glm::vec3 world, int width,
                                           int height) {
  if (width <= 0 || height <= 0) return std::nullopt;
  glm::vec4 clip =
      projection_matrix(v, float(width) / float(height)) * view_matrix(v) * glm::vec4(world, 1.0f);
  if (clip.w <= 1e-6f) return std::nullopt;
  glm::vec3 ndc = glm::vec3(clip) / clip.w;
  return glm::vec2((ndc.x * 0.5f + 0.5f) * width, (0.5f - ndc.y * 0.5f) * height);
}

std::optional<glm::vec2> project_to_viewport(const CameraView& v, glm::vec3 world,
                                             const Viewport& vp) {
  auto p = project_to_screen(v, world, vp.width, vp.height);
  if (!p) return std::nullopt;
  return glm::vec2(p->x + float(vp.x), p->y + float(vp.y));
}

}  // namespace kvscope::render
