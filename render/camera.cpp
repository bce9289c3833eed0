// camera.cpp — orbit camera math, presets and framing.
#include "render/camera.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include <glm/gtc/matrix_transform.hpp>

namespace render {
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

Orbit Camera::framed(CameraPreset p) const {
  Orbit o = preset_orbit(p);
  Bounds b = content_;
  if (p == CameraPreset::Follow) {
    // A fixed-size window around the head: a few tokens back, one ahead.
    b.min.x = head_.x - 9.0f;
    b.max.x = head_.x + 1.5f;
  } else if (b.max.x - b.min.x > window_) {
    b.max.x = std::max(head_.x + 1.0f, b.min.x + 1.0f);
    b.min.x = std::max(b.min.x, b.max.x - window_);
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
  o.distance = dist * 1.08f + 0.5f;
  return o;
}

void Camera::set_preset(CameraPreset p, bool instant) {
  preset_ = p;
  auto_framing_ = true;
  goal_ = framed(p);
  // Take the short way round.
  cur_.yaw_deg = goal_.yaw_deg + wrap_degrees(cur_.yaw_deg - goal_.yaw_deg);
  if (instant) cur_ = goal_;
}

void Camera::set_content(const Bounds& content, glm::vec3 head, float window) {
  content_ = content;
  head_ = head;
  window_ = std::max(window, 4.0f);
  if (auto_framing_) goal_ = framed(preset_);
}

void Camera::orbit(float d_yaw_deg, float d_pitch_deg) {
  auto_framing_ = false;
  goal_.yaw_deg += d_yaw_deg;
  goal_.pitch_deg = std::clamp(goal_.pitch_deg + d_pitch_deg, -89.9f, 90.0f);
}

void Camera::pan(float dx, float dy) {
  auto_framing_ = false;
  Basis bs = basis(goal_.yaw_deg, goal_.pitch_deg);
  float h = 2.0f * goal_.distance * std::tan(glm::radians(fov_y_deg_) * 0.5f);
  goal_.target += (-dx * bs.right + dy * bs.up) * h;
}

void Camera::zoom(float steps) {
  auto_framing_ = false;
  goal_.distance = std::clamp(goal_.distance * std::pow(0.88f, steps), 0.5f, 5000.0f);
}

void Camera::update(float dt) {
  if (dt <= 0.0f) {
    cur_ = goal_;
    return;
  }
  float a = 1.0f - std::exp(-6.0f * dt);  // ~0.5 s to settle
  cur_.target += (goal_.target - cur_.target) * a;
  cur_.yaw_deg += (goal_.yaw_deg - cur_.yaw_deg) * a;
  cur_.pitch_deg += (goal_.pitch_deg - cur_.pitch_deg) * a;
  // Zoom in log space so large jumps feel even.
  cur_.distance *= std::pow(goal_.distance / cur_.distance, a);
}

CameraView Camera::view() const {
  Basis bs = basis(cur_.yaw_deg, cur_.pitch_deg);
  CameraView v;
  v.target = cur_.target;
  v.eye = cur_.target + bs.offset * cur_.distance;
  v.up = bs.up;
  v.fov_y_deg = fov_y_deg_;
  v.near_plane = std::max(0.05f, cur_.distance * 0.01f);
  float extent = glm::length(content_.max - content_.min);
  v.far_plane = cur_.distance * 4.0f + extent + 100.0f;
  return v;
}

glm::mat4 view_matrix(const CameraView& v) {
  return glm::lookAt(v.eye, v.target, v.up);
}

glm::mat4 projection_matrix(const CameraView& v, float aspect) {
  return glm::perspective(glm::radians(v.fov_y_deg), aspect, v.near_plane, v.far_plane);
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

}  // namespace render
