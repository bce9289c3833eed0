#version 330 core
// head.frag — emissive sphere: hot core, brighter rim.
in vec3 v_normal;
in vec3 v_world;
uniform vec3 u_eye;
uniform vec3 u_color;
out vec4 frag_color;
void main() {
  vec3 n = normalize(v_normal);
  vec3 v = normalize(u_eye - v_world);
  float facing = max(dot(n, v), 0.0);
  vec3 core = mix(u_color, vec3(1.0), pow(facing, 3.0) * 0.7);
  vec3 rim = u_color * pow(1.0 - facing, 2.0) * 0.8;
  frag_color = vec4(core + rim, 1.0);
}
