// frustum.cpp — frustum planes from a view-projection matrix and the box test.
#include "render/frustum.h"

#include <glm/geometric.hpp>

namespace kvscope::render {

std::array<glm::vec4, 6> frustum_planes(const glm::mat4& m) {
  // Rows of the matrix (glm is column-major: m[column][row]).
  glm::vec4 r0{m[0][0], m[1][0], m[2][0], m[3][0]}, r1{m[0][1], m[1][1], m[2][1], m[3][1]},
      r2{m[0][2], m[1][2], m[2][2], m[3][2]}, r3{m[0][3], m[1][3], m[2][3], m[3][3]};
  return {r3 + r0, r3 - r0, r3 + r1, r3 - r1, r3 + r2, r3 - r2};
}

bool box_visible(const std::array<glm::vec4, 6>& planes, glm::vec3 lo, glm::vec3 hi) {
  for (const glm::vec4& p : planes) {
    // The box corner furthest along the plane's normal.
    glm::vec3 far{p.x >= 0 ? hi.x : lo.x, p.y >= 0 ? hi.y : lo.y, p.z >= 0 ? hi.z : lo.z};
    if (glm::dot(glm::vec3(p), far) + p.w < 0) return false;
  }
  return true;
}

}  // namespace kvscope::render
