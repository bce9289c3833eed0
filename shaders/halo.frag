#version 330 core
// halo.frag — radial falloff, blended additively.
in vec2 v_uv;
uniform vec3 u_color;
uniform float u_glow;
out vec4 frag_color;
void main() {
  float r = length(v_uv);
  float a = exp(-r * r * 5.0) * 0.9 + exp(-r * 2.5) * 0.25;
  a *= smoothstep(1.0, 0.8, r) * u_glow;
  frag_color = vec4(u_color * a, a);
}
