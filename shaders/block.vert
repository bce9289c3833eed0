#version 330 core
// block.vert — instanced boxes (token blocks and KV-cache blocks).
// Per vertex: unit-cube corner (a_pos in [-0.5, 0.5]) and face normal.
// Per instance: center, color, params = (brightness, recompute, highlight, flash gain
// toward white),
// anim = (flash gain on brightness, flash gain on recompute, drop height),
// style = (leave, hatch K, hatch V, slide).
// Uniforms animate them without re-uploading instances: u_flash (step flash), u_fall
// (tokens dropping in), u_leave (evicted blocks shrinking and sinking away), u_slide
// (survivors of a context shift sliding left).
layout(location = 0) in vec3 a_pos;
layout(location = 1) in vec3 a_normal;
layout(location = 2) in vec3 i_center;
layout(location = 3) in vec3 i_color;
layout(location = 4) in vec4 i_params;
layout(location = 5) in vec3 i_anim;
layout(location = 6) in vec4 i_style;

uniform mat4 u_view_proj;
uniform vec3 u_size;
uniform float u_flash;
uniform float u_fall;
uniform float u_leave;
uniform float u_slide;

out vec3 v_normal;
out vec3 v_local;
out vec3 v_color;
out vec4 v_params;
out vec3 v_world;
out vec2 v_hatch;
out vec3 v_size;

void main() {
  float leave = clamp(i_style.x * u_leave, 0.0, 1.0);
  vec3 size = u_size * (1.0 - leave);
  vec3 center = i_center + vec3(i_style.w * u_slide, i_anim.z * u_fall - 0.6 * leave, 0.0);
  vec3 world = center + a_pos * size;
  v_normal = a_normal;
  v_local = a_pos;
  v_color = i_color;
  v_params = i_params;
  if (i_anim.x > 0.0) v_params.x = min(i_params.x + i_anim.x * u_flash, 1.0);
  if (i_anim.y > 0.0) v_params.y = min(i_params.y + i_anim.y * u_flash, 1.0);
  v_params.w = clamp(i_params.w * u_flash, 0.0, 1.0);
  v_params.x *= 1.0 - leave;
  v_world = world;
  v_hatch = i_style.yz;
  v_size = size;
  gl_Position = u_view_proj * vec4(world, 1.0);
}
