#version 330 core
// beam.frag — soft-edged ribbon; brightness follows the attention weight.
in float v_side;
in float v_t;
in float v_weight;
in vec3 v_color;
out vec4 frag_color;
void main() {
  float across = 1.0 - v_side * v_side;           // 1 at the center line
  float edge = smoothstep(0.0, 0.9, 1.0 - abs(v_side));
  float ends = smoothstep(0.0, 0.06, v_t) * (0.55 + 0.45 * smoothstep(0.2, 1.0, v_t));
  float a = clamp(v_weight, 0.0, 1.0) * edge * ends;
  vec3 c = mix(v_color, vec3(1.0), 0.5 * across * v_weight);
  frag_color = vec4(c * a, a);
}
