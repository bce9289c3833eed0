#version 330 core
// glyph.frag — coverage from the R8 atlas with a dark outline for contrast.
in vec2 v_uv;
in vec4 v_color;
uniform sampler2D u_atlas;
uniform vec2 u_texel;
out vec4 frag_color;
void main() {
  float a = texture(u_atlas, v_uv).r;
  float o = 0.0;
  o = max(o, texture(u_atlas, v_uv + vec2(u_texel.x, 0.0)).r);
  o = max(o, texture(u_atlas, v_uv - vec2(u_texel.x, 0.0)).r);
  o = max(o, texture(u_atlas, v_uv + vec2(0.0, u_texel.y)).r);
  o = max(o, texture(u_atlas, v_uv - vec2(0.0, u_texel.y)).r);
  float alpha = max(a, o * 0.85) * v_color.a;
  vec3 c = mix(vec3(0.0), v_color.rgb, a / max(max(a, o * 0.85), 1e-4));
  if (alpha < 0.01) discard;
  frag_color = vec4(c, alpha);
}
