#version 330 core
// beam.vert — attention beams as camera-facing ribbons along a raised arc.
// No vertex buffer: gl_VertexID walks a triangle strip of 2*(u_segments+1) vertices
// (even = one side, odd = the other). Per instance: from, to, weight, color.
// u_shift moves every origin, u_fade scales every weight, u_arc shapes the arcs (per-frame
// animation; see render::BeamArc).
layout(location = 0) in vec3 i_from;
layout(location = 1) in vec3 i_to;
layout(location = 2) in float i_weight;
layout(location = 3) in vec3 i_color;

uniform mat4 u_view_proj;
uniform vec3 u_eye;
uniform int u_segments;
uniform float u_width;
uniform vec3 u_shift;
uniform float u_fade;
uniform vec3 u_arc;  // rise, rise per unit of span, lean (-z) per unit of span
uniform float u_px_scale;  // pixels per world unit at distance 1 (proj[1][1] * viewport_h / 2)
uniform float u_min_px;    // a beam is never thinner than this on screen
// Beams whose target's x lies in [x, y] (the tokens in view) are ribbons u_width wide; the
// others are drawn at u_min_px only (a level of detail: they leave the view).
uniform vec2 u_wide_x;

out float v_side;
out float v_t;
out float v_weight;
out vec3 v_color;

vec3 arc(float t, vec3 p0, vec3 p1, vec3 p2) {
  float s = 1.0 - t;
  return s * s * p0 + 2.0 * s * t * p1 + t * t * p2;
}

void main() {
  float t = float(gl_VertexID / 2) / float(u_segments);
  float side = (gl_VertexID & 1) == 0 ? -1.0 : 1.0;
  vec3 from = i_from + u_shift;
  float span = length(i_to - from);
  // Arcs rise and lean back (-z) so they read as arcs from the side and fan out from above.
  vec3 mid = 0.5 * (from + i_to) + vec3(0.0, u_arc.x + u_arc.y * span, -u_arc.z * span);
  vec3 p = arc(t, from, mid, i_to);
  vec3 tangent = normalize(arc(min(t + 0.01, 1.0), from, mid, i_to) -
                           arc(max(t - 0.01, 0.0), from, mid, i_to));
  vec3 to_eye = normalize(u_eye - p);
  vec3 offset = cross(tangent, to_eye);
  float len = length(offset);
  offset = len > 1e-5 ? offset / len : vec3(0.0, 0.0, 1.0);
  float w = clamp(i_weight * u_fade, 0.0, 1.0);
  bool wide = i_to.x >= u_wide_x.x && i_to.x <= u_wide_x.y;
  float width = wide ? u_width * (0.35 + 1.65 * sqrt(w)) : 0.0;
  // Seen from far (TOP over a long sequence) beams keep a visible width.
  float world_per_px = (u_view_proj * vec4(p, 1.0)).w / u_px_scale;
  width = max(width, u_min_px * world_per_px);
  p += offset * side * width * 0.5;
  v_side = side;
  v_t = t;
  v_weight = w;
  v_color = i_color;
  gl_Position = u_view_proj * vec4(p, 1.0);
}
