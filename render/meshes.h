// meshes.h — the few static meshes the renderer instances: a unit cube and a unit sphere.
// Vertex layout for both: interleaved position (3 floats) + normal (3 floats).
#pragma once

#include <cstdint>
#include <vector>

namespace kvscope::render {

struct MeshData {
  std::vector<float> vertices;    // [n][6]: x, y, z, nx, ny, nz
  std::vector<uint32_t> indices;  // triangles; empty = non-indexed
};

MeshData make_cube();                          // 36 vertices, corners at +-0.5
MeshData make_sphere(int slices, int stacks);  // radius 1, indexed

}  // namespace kvscope::render
