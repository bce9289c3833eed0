#version 330 core
// marker.frag — flat emissive color, lightly shaded by face so the box reads as solid.
in vec3 v_color;
in float v_shade;
out vec4 frag_color;
void main() { frag_color = vec4(v_color * v_shade, 1.0); }
