#version 330 core
// block.frag — lit box with darkened edges, emissive when bright, red when recomputed,
// hatched when the cache it stands for is quantized (rising stripes: K, falling: V).
in vec3 v_normal;
in vec3 v_local;
in vec3 v_color;
in vec4 v_params;
in vec3 v_world;
in vec2 v_hatch;
in vec3 v_size;

uniform vec3 u_eye;
uniform float u_haze;  // 0..1 strength of the depth haze

out vec4 frag_color;

void main() {
  float brightness = clamp(v_params.x, 0.0, 1.0);
  float recompute = clamp(v_params.y, 0.0, 1.0);
  float highlight = clamp(v_params.z, 0.0, 1.0);

  vec3 n = normalize(v_normal);
  vec3 key = normalize(vec3(0.35, 0.8, 0.55));
  vec3 fill = normalize(vec3(-0.6, 0.3, -0.4));
  float diffuse = 0.55 * max(dot(n, key), 0.0) + 0.2 * max(dot(n, fill), 0.0) + 0.38;

  // Distance to the nearest edge of this face, in world units: a thin dark bevel line
  // keeps neighbouring blocks apart at any zoom.
  vec3 a = abs(v_local) * v_size;
  vec3 half_size = 0.5 * v_size;
  vec3 d = half_size - a;  // per-axis distance to the face boundary
  vec3 an = abs(n);
  float e = an.x > 0.5 ? min(d.y, d.z) : an.y > 0.5 ? min(d.x, d.z) : min(d.x, d.y);
  float w = fwidth(e) * 1.2 + 1e-4;
  float edge = smoothstep(0.0, w, e);

  vec3 base = v_color * mix(0.18, 1.0, brightness);
  vec3 color = base * diffuse;
  color += v_color * max(brightness - 0.8, 0.0) * 1.2;  // emissive for the brightest
  vec3 red = vec3(1.0, 0.08, 0.06);
  color = mix(color, red * (0.75 + 0.35 * diffuse), recompute);
  color = mix(color, vec3(1.0), clamp(v_params.w, 0.0, 1.0));  // the step-flash toward white
  color = mix(color, vec3(1.0, 0.95, 0.55), highlight * 0.45);
  color *= mix(0.35, 1.0, edge);

  // Hatching: the face's two in-plane coordinates (world units from the block's center),
  // dark bands along one diagonal per quantized type, anti-aliased by their screen width.
  vec3 p = v_local * v_size;
  vec2 f = an.x > 0.5 ? p.zy : an.y > 0.5 ? p.xz : p.xy;
  float dark = 0.0;
  for (int i = 0; i < 2; ++i) {
    float k = i == 0 ? v_hatch.x : v_hatch.y;
    if (k <= 0.0) continue;
    float s = (i == 0 ? f.x + f.y : f.x - f.y) * k;
    float band = abs(fract(s) - 0.5);  // 0 in the middle of a stripe, 0.5 between
    float aa = fwidth(s) + 1e-4;
    dark = max(dark, 1.0 - smoothstep(0.22 - aa, 0.22 + aa, band));
  }
  color *= 1.0 - 0.55 * dark;

  // Gentle depth haze towards the background.
  float dist = length(u_eye - v_world);
  color = mix(color, vec3(0.035, 0.04, 0.06), u_haze * clamp((dist - 60.0) / 400.0, 0.0, 0.6));
  frag_color = vec4(color, 1.0);
}
