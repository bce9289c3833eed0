// camera.h — an orbit camera with presets, smooth transitions and auto framing.
//
// Knows nothing of the window system: the app feeds it mouse deltas, scroll steps,
// the content bounds and the frame time; it produces a CameraView each frame.
// Invariants: distance > 0; pitch in [-89.9, 90] degrees; the view's up vector is
// derived from yaw/pitch so TOP (pitch 90) is not degenerate.
#pragma once

#include <optional>
#include <string_view>

#include <glm/mat4x4.hpp>
#include <glm/vec2.hpp>
#include <glm/vec3.hpp>

#include "render/scene.h"

namespace render {

enum class CameraPreset { Top, Side, Front, ThreeQuarter, Follow };
inline constexpr CameraPreset kAllCameraPresets[] = {
    CameraPreset::Top, CameraPreset::Side, CameraPreset::Front, CameraPreset::ThreeQuarter,
    CameraPreset::Follow};
const char* camera_preset_name(CameraPreset p);  // "top", "side", "front", "3/4", "follow"
// Accepts the names above (case-insensitive) and "34", "three-quarter".
std::optional<CameraPreset> parse_camera_preset(std::string_view s);

struct Bounds {
  glm::vec3 min{0.0f};
  glm::vec3 max{0.0f};
};

// Orbit parameters: the eye sits `distance` away from `target` at yaw (around +y,
// 0 = on +z) and pitch (elevation, 90 = straight down).
struct Orbit {
  glm::vec3 target{0.0f};
  float yaw_deg = 0.0f;
  float pitch_deg = 10.0f;
  float distance = 20.0f;
};

class Camera {
 public:
  Camera();

  // Selects a preset and turns auto framing back on; `instant` skips the transition.
  void set_preset(CameraPreset p, bool instant = false);
  CameraPreset preset() const { return preset_; }
  bool auto_framing() const { return auto_framing_; }

  // Framing inputs for this frame: everything drawn and the write head. When the
  // content is wider than `window` world units, framing keeps the last `window` units
  // before the head in view (the part that is changing).
  void set_content(const Bounds& content, glm::vec3 head, float window = 40.0f);
  void set_aspect(float aspect) { aspect_ = aspect > 0.01f ? aspect : 1.0f; }

  // User input (turns auto framing off until a preset is chosen again).
  void orbit(float d_yaw_deg, float d_pitch_deg);
  void pan(float dx, float dy);  // in units of the view height at the target
  void zoom(float steps);        // > 0 moves closer

  // Advances the transition by dt seconds (dt <= 0 jumps to the goal).
  void update(float dt);
  CameraView view() const;
  const Orbit& current() const { return cur_; }
  const Orbit& goal() const { return goal_; }
  float fov_y_deg() const { return fov_y_deg_; }

 private:
  Orbit preset_orbit(CameraPreset p) const;
  Orbit framed(CameraPreset p) const;

  CameraPreset preset_ = CameraPreset::ThreeQuarter;
  bool auto_framing_ = true;
  Orbit cur_, goal_;
  Bounds content_{};
  glm::vec3 head_{0.0f};
  float window_ = 40.0f;
  float aspect_ = 16.0f / 9.0f;
  float fov_y_deg_ = 40.0f;
};

glm::mat4 view_matrix(const CameraView& v);
glm::mat4 projection_matrix(const CameraView& v, float aspect);
// World point -> pixel coordinates (origin top-left). nullopt when behind the camera.
std::optional<glm::vec2> project_to_screen(const CameraView& v, glm::vec3 world, int width,
                                           int height);

}  // namespace render
