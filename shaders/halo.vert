#version 330 core
// halo.vert — a camera-facing quad around the head for the additive glow.
// Four vertices from gl_VertexID (triangle strip), no vertex buffer.
uniform mat4 u_view;
uniform mat4 u_proj;
uniform vec3 u_center;
uniform float u_size;
out vec2 v_uv;
void main() {
  vec2 corner = vec2(float(gl_VertexID & 1), float((gl_VertexID >> 1) & 1)) * 2.0 - 1.0;
  v_uv = corner;
  vec4 c = u_view * vec4(u_center, 1.0);
  c.xy += corner * u_size;
  gl_Position = u_proj * c;
}
