#version 330 core
// grid.frag — anti-aliased minor/major grid lines that fade towards the extent's edge.
in vec2 v_xz;
uniform float u_spacing;
uniform vec3 u_color;
uniform vec4 u_extent;
out vec4 frag_color;
float lines(vec2 p, float spacing) {
  vec2 g = p / spacing;
  vec2 d = abs(fract(g - 0.5) - 0.5) / fwidth(g);
  return 1.0 - min(min(d.x, d.y), 1.0);
}
void main() {
  float minor = lines(v_xz, u_spacing);
  float major = lines(v_xz, u_spacing * 8.0);
  vec2 c = 0.5 * (u_extent.xy + u_extent.zw);
  vec2 h = 0.5 * (u_extent.zw - u_extent.xy);
  vec2 q = abs(v_xz - c) / h;
  float fade = 1.0 - smoothstep(0.6, 1.0, max(q.x, q.y));
  float a = max(minor * 0.35, major * 0.8) * fade;
  if (a < 0.005) discard;
  frag_color = vec4(u_color * (1.0 + major * 0.6), a);
}
