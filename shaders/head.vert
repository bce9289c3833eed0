#version 330 core
// head.vert — the write-head sphere (unit sphere mesh scaled and moved).
layout(location = 0) in vec3 a_pos;
uniform mat4 u_view_proj;
uniform vec3 u_center;
uniform float u_radius;
out vec3 v_normal;
out vec3 v_world;
void main() {
  v_normal = a_pos;
  v_world = u_center + a_pos * u_radius;
  gl_Position = u_view_proj * vec4(v_world, 1.0);
}
