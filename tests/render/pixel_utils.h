// pixel_utils.h — offscreen rendering of a scene and small pixel queries for tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <glm/vec2.hpp>
#include <glm/vec3.hpp>

#include "render/camera.h"
#include "render/renderer.h"
#include "render/scene.h"

namespace kvscope::test {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgba;  // top row first
  glm::vec3 at(int x, int y) const {
    const uint8_t* p = &rgba[(size_t(y) * width + x) * 4];
    return {p[0] / 255.0f, p[1] / 255.0f, p[2] / 255.0f};
  }
  bool inside(int x, int y) const { return x >= 0 && y >= 0 && x < width && y < height; }
};

// Frames `scene` with a camera preset (instant transition) and sets scene->camera.
void frame_scene(render::Scene* scene, render::CameraPreset preset, int width, int height);
// Renders into an offscreen target and reads it back (fails the test on GL errors).
Image render_image(render::Renderer& r, const render::Scene& scene, int width, int height);
// Number of separate runs of pixels along a row (or column) for which pred is true.
template <class Pred>
int count_runs(const Image& img, bool vertical, int fixed, Pred pred) {
  int runs = 0;
  bool in = false;
  int n = vertical ? img.height : img.width;
  for (int i = 0; i < n; ++i) {
    glm::vec3 c = vertical ? img.at(fixed, i) : img.at(i, fixed);
    bool p = pred(c);
    if (p && !in) ++runs;
    in = p;
  }
  return runs;
}
// The share of the pixels within (rx, ry) of pixel `c` (those inside the image) for which
// pred is true: what a small patch around a projected point looks like.
template <class Pred>
float share_around(const Image& img, glm::vec2 c, int rx, int ry, Pred pred) {
  int n = 0, yes = 0;
  for (int dy = -ry; dy <= ry; ++dy)
    for (int dx = -rx; dx <= rx; ++dx) {
      const int x = int(c.x) + dx, y = int(c.y) + dy;
      if (!img.inside(x, y)) continue;
      ++n;
      yes += pred(img.at(x, y)) ? 1 : 0;
    }
  return n ? float(yes) / float(n) : 0.0f;
}
// " (pixel X,Y: R G B)" for the pixel at `c`, to say in a failure what was there.
std::string pixel_note(const Image& img, glm::vec2 c);
// World point -> pixel (origin top-left) through the scene's camera, computed here from the
// camera's eye, target, up and field of view, independently of the renderer's projection.
glm::vec2 to_screen(const render::Scene& s, glm::vec3 world, int width, int height);
glm::vec2 to_screen(const render::CameraView& v, glm::vec3 world, int width, int height);

}  // namespace kvscope::test
