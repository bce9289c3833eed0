#version 330 core
// block.vert — instanced boxes (token blocks and KV-cache blocks).
// Per vertex: unit-cube corner (a_pos in [-0.5, 0.5]) and face normal.
// Per instance: center, color, params = (brightness, recompute, highlight, unused).
layout(location = 0) in vec3 a_pos;
layout(location = 1) in vec3 a_normal;
layout(location = 2) in vec3 i_center;
layout(location = 3) in vec3 i_color;
layout(location = 4) in vec4 i_params;

uniform mat4 u_view_proj;
uniform vec3 u_size;

out vec3 v_normal;
out vec3 v_local;
out vec3 v_color;
out vec4 v_params;
out vec3 v_world;

void main() {
  vec3 world = i_center + a_pos * u_size;
  v_normal = a_normal;
  v_local = a_pos;
  v_color = i_color;
  v_params = i_params;
  v_world = world;
  gl_Position = u_view_proj * vec4(world, 1.0);
}
