#version 330 core
// marker.vert — instanced thin emissive boxes that mark places (a layer's window boundary).
// Per vertex: unit-cube corner and normal. Per instance: center, full size, color.
layout(location = 0) in vec3 a_pos;
layout(location = 1) in vec3 a_normal;
layout(location = 2) in vec3 i_center;
layout(location = 3) in vec3 i_size;
layout(location = 4) in vec3 i_color;

uniform mat4 u_view_proj;

out vec3 v_color;
out float v_shade;

void main() {
  v_color = i_color;
  v_shade = 0.8 + 0.2 * abs(a_normal.y) + 0.1 * abs(a_normal.z);
  gl_Position = u_view_proj * vec4(i_center + a_pos * i_size, 1.0);
}
