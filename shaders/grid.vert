#version 330 core
// grid.vert — one large floor quad from gl_VertexID; lines are drawn per pixel.
uniform mat4 u_view_proj;
uniform vec4 u_extent;  // x0, z0, x1, z1
uniform float u_height;
out vec2 v_xz;
void main() {
  vec2 k = vec2(float(gl_VertexID & 1), float((gl_VertexID >> 1) & 1));
  v_xz = mix(u_extent.xy, u_extent.zw, k);
  gl_Position = u_view_proj * vec4(v_xz.x, u_height, v_xz.y, 1.0);
}
