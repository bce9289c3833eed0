// frustum.h — what the camera can see: frustum planes and box tests, and the contiguous
// range of x-sorted instances in an x interval (how the renderer draws only what is in
// view). Pure math, no GL.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <vector>

#include <glm/mat4x4.hpp>
#include <glm/vec3.hpp>
#include <glm/vec4.hpp>

namespace kvscope::render {

// A run of instances: [first, first + count).
struct InstanceRange {
  size_t first = 0, count = 0;
};

// The six planes of the frustum of `view_proj` (Gribb & Hartmann): a point p is inside
// when dot(plane.xyz, p) + plane.w >= 0 for all six.
std::array<glm::vec4, 6> frustum_planes(const glm::mat4& view_proj);

// False only when the box [lo, hi] lies entirely outside one of the planes (so it is
// certainly not visible); conservative near the frustum's edges.
bool box_visible(const std::array<glm::vec4, 6>& planes, glm::vec3 lo, glm::vec3 hi);

// The elements of `v` (sorted by x_of) whose x lies in [x0, x1].
template <class T, class F>
InstanceRange x_range(const std::vector<T>& v, float x0, float x1, F x_of) {
  auto lo =
      std::lower_bound(v.begin(), v.end(), x0, [&](const T& a, float x) { return x_of(a) < x; });
  auto hi = std::upper_bound(lo, v.end(), x1, [&](float x, const T& a) { return x < x_of(a); });
  return {size_t(lo - v.begin()), size_t(hi - lo)};
}

}  // namespace kvscope::render
