#version 330 core
// glyph.vert — instanced text quads, camera-facing, sized in world units.
// Per instance: anchor (world), rect (x0, y0, x1, y1 in line units), uv rect, color,
// drop (world units above the anchor when u_fall is 1: labels fall with their token),
// min_px, extra = (flat, slide: world units along +x when u_slide is 1).
// Vertical labels (u_vertical, unless the instance is flat) turn the line so it reads
// bottom-to-top on screen. min_px > 0: the
// label never gets smaller than that many pixels tall; every label grows toward u_fit_px
// while the token spacing on screen leaves room; what stays below ~5 px fades out.
layout(location = 0) in vec3 i_anchor;
layout(location = 1) in vec4 i_rect;
layout(location = 2) in vec4 i_uv;
layout(location = 3) in vec4 i_color;
layout(location = 4) in float i_drop;
layout(location = 5) in float i_min_px;
layout(location = 6) in vec2 i_extra;

uniform mat4 u_view;
uniform mat4 u_proj;
uniform float u_height;
uniform int u_vertical;
uniform float u_fall;
uniform float u_slide;
uniform float u_viewport_h;  // pixels
uniform float u_fit_px;      // every label grows toward this while its neighbours leave room

out vec2 v_uv;
out vec4 v_color;

void main() {
  vec2 k = vec2(float(gl_VertexID & 1), float((gl_VertexID >> 1) & 1));
  vec2 local = vec2(mix(i_rect.x, i_rect.z, k.x), mix(i_rect.y, i_rect.w, k.y));
  v_uv = vec2(mix(i_uv.x, i_uv.z, k.x), mix(i_uv.w, i_uv.y, k.y));
  v_color = i_color;
  vec2 offset = u_vertical != 0 && i_extra.x < 0.5 ? vec2(-local.y, local.x) : local;
  vec4 c = u_view * vec4(i_anchor + vec3(i_extra.y * u_slide, i_drop * u_fall, 0.0), 1.0);
  // Level of detail, from the line's height on screen: a label grows toward u_fit_px as
  // long as it stays narrower than the distance to the next token (vertical labels are one
  // line wide), and to its own min_px whatever the room; what is still too small to read
  // fades out.
  float unit_px = u_proj[1][1] * 0.5 * u_viewport_h / max(-c.z, 1e-3);  // px per world unit
  float px = u_height * unit_px;
  float want = max(i_min_px, min(u_fit_px, 0.8 * unit_px));
  float grow = max(1.0, want / max(px, 1e-3));
  v_color.a *= smoothstep(3.5, 6.5, px * grow);
  c.xy += offset * u_height * grow;
  gl_Position = u_proj * c;
}
