// meshes.cpp — cube and UV-sphere generation.
#include "render/meshes.h"

#include <cmath>

namespace kvscope::render {

MeshData make_cube() {
  MeshData m;
  // For each face: normal axis a, sign s; two tangent axes (b, c) in counter-clockwise
  // order seen from outside.
  for (int a = 0; a < 3; ++a) {
    for (int s = -1; s <= 1; s += 2) {
      int b = (a + 1) % 3, c = (a + 2) % 3;
      if (s < 0) std::swap(b, c);
      float corners[4][2] = {{-0.5f, -0.5f}, {0.5f, -0.5f}, {0.5f, 0.5f}, {-0.5f, 0.5f}};
      int order[6] = {0, 1, 2, 0, 2, 3};
      for (int k : order) {
        float p[3], n[3] = {0, 0, 0};
        p[a] = 0.5f * s;
        p[b] = corners[k][0];
        p[c] = corners[k][1];
        n[a] = float(s);
        m.vertices.insert(m.vertices.end(), {p[0], p[1], p[2], n[0], n[1], n[2]});
      }
    }
  }
  return m;
}

MeshData make_sphere(int slices, int stacks) {
  MeshData m;
  const float pi = 3.14159265358979f;
  for (int i = 0; i <= stacks; ++i) {
    float phi = pi * float(i) / float(stacks);
    for (int j = 0; j <= slices; ++j) {
      float theta = 2.0f * pi * float(j) / float(slices);
      float x = std::sin(phi) * std::cos(theta), y = std::cos(phi),
            z = std::sin(phi) * std::sin(theta);
      m.vertices.insert(m.vertices.end(), {x, y, z, x, y, z});
    }
  }
  for (int i = 0; i < stacks; ++i) {
    for (int j = 0; j < slices; ++j) {
      uint32_t a = uint32_t(i * (slices + 1) + j), b = a + uint32_t(slices + 1);
      m.indices.insert(m.indices.end(), {a, a + 1, b, b, a + 1, b + 1});
    }
  }
  return m;
}

}  // namespace kvscope::render
