// camera.h — an orbit camera with presets, smooth transitions and auto framing.
//
// Knows nothing of the window system: the app feeds it pointer deltas, scroll steps,
// what each preset should frame, the aspect of the rectangle it draws into and the frame
// time; it produces a CameraView each frame.
// Presets frame what they are about: TOP the whole sequence and every beam (the fan as a
// 2D graph), SIDE / FRONT / 3/4 the recent part before the head, FOLLOW the head and the
// last few tokens (and keeps tracking the head while the user orbits or zooms).
// Invariants: distance > 0; pitch in [-89.9, 90] degrees; the eye never goes below the
// ground (set_ground); the view's up vector is derived from yaw/pitch so TOP (pitch 90)
// is not degenerate.
#pragma once

#include <optional>
#include <string_view>

#include <glm/mat4x4.hpp>
#include <glm/vec2.hpp>
#include <glm/vec3.hpp>

#include "render/scene.h"

namespace kvscope::render {

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

// What the presets frame (see framing_content): everything, the recent part, the head.
struct FramingContent {
  Bounds all;     // every token, stack, the head, every beam's arc
  Bounds recent;  // the last `window` units before the head, its stacks, the beams landing there
  Bounds follow;  // the head and the last few tokens
  glm::vec3 head{0.0f};
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
  void set_content(const FramingContent& content);
  // y of the floor: the eye stays above it.
  void set_ground(float y) { ground_ = y; }
  void set_aspect(float aspect) { aspect_ = aspect > 0.01f ? aspect : 1.0f; }

  // User input (turns auto framing off until a preset is chosen again).
  void orbit(float d_yaw_deg, float d_pitch_deg);
  void pan(float dx, float dy);  // in units of the view height at the target
  void zoom(float steps);        // > 0 moves closer
  // Zooms toward the point under the pointer, given in normalized device coordinates of
  // the view ([-1, 1], y up): that point stays under the pointer.
  void zoom_at(float steps, glm::vec2 ndc);
  // Slides the target along x to `x` (keeps the orientation and distance).
  void look_at_x(float x);

  // Advances the transition by dt seconds (dt <= 0 jumps to the goal).
  void update(float dt);
  CameraView view() const;
  // True when the transition has (visually) reached its goal.
  bool settled() const;
  const Orbit& current() const { return cur_; }
  const Orbit& goal() const { return goal_; }
  float fov_y_deg() const { return fov_y_deg_; }

 private:
  Orbit preset_orbit(CameraPreset p) const;
  Orbit framed(CameraPreset p) const;
  void keep_above_ground(Orbit* o) const;
  bool follow_tracking() const;

  CameraPreset preset_ = CameraPreset::ThreeQuarter;
  bool auto_framing_ = true;
  Orbit cur_, goal_;
  FramingContent content_{};
  float ground_ = -1e9f;
  float aspect_ = 16.0f / 9.0f;
  float fov_y_deg_ = 40.0f;
  // FOLLOW keeps tracking the head while the user orbits and zooms: their changes are
  // kept as offsets to the framed orbit.
  float follow_yaw_ = 0.0f, follow_pitch_ = 0.0f, follow_zoom_ = 1.0f;
  // A preset change eases from `from_` to the goal over kTransitionSeconds; transition_ is
  // its progress in [0, 1), or -1 when none runs.
  static constexpr float kTransitionSeconds = 0.9f;
  Orbit from_;
  float transition_ = -1.0f;
};

// The three framing boxes of a scene: `window` world units before the head for the recent
// part, `follow_window` for FOLLOW; beams are bounded with `arc` (the preset's shape).
FramingContent framing_content(const Scene& s, const BeamArc& arc, float window = 40.0f,
                               float follow_window = 12.0f);
// The beam shape a preset shows: TOP leans the arcs back far enough to read as a fan.
BeamArc preset_beam_arc(CameraPreset p);

glm::mat4 view_matrix(const CameraView& v);
glm::mat4 projection_matrix(const CameraView& v, float aspect);
// The world radius the write head is drawn with in a view `height_px` pixels tall: its
// radius, or larger where that would be under head.min_px pixels on screen.
float head_drawn_radius(const Scene& s, float height_px);
// World point -> pixel coordinates (origin top-left). nullopt when behind the camera.
std::optional<glm::vec2> project_to_screen(const CameraView& v, glm::vec3 world, int width,
                                           int height);
// The same for a view drawn into `vp`: coordinates are those of the whole framebuffer.
std::optional<glm::vec2> project_to_viewport(const CameraView& v, glm::vec3 world,
                                             const Viewport& vp);

}  // namespace kvscope::render
