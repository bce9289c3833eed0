// pixel_utils.cpp — offscreen render + camera framing helpers for pixel tests.
#include "pixel_utils.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <glm/gtc/matrix_transform.hpp>
#include <glm/mat4x4.hpp>

#include "render/offscreen.h"
#include "render/synthetic_scene.h"

namespace kvscope::test {

void frame_scene(render::Scene* scene, render::CameraPreset preset, int width, int height) {
  render::Camera cam;
  cam.set_aspect(float(width) / float(height));
  glm::vec3 head = scene->head.position;
  cam.set_content(render::scene_bounds(*scene), head);
  cam.set_preset(preset, /*instant=*/true);
  scene->camera = cam.view();
}

Image render_image(render::Renderer& r, const render::Scene& scene, int width, int height) {
  auto target = render::OffscreenTarget::create(width, height, 4);
  EXPECT_TRUE(target.ok()) << (target.ok() ? "" : target.error().message);
  Image img;
  if (!target.ok()) return img;
  target->bind();
  r.draw(scene, width, height);
  auto rgba = target->read_rgba();
  EXPECT_TRUE(rgba.ok()) << (rgba.ok() ? "" : rgba.error().message);
  if (rgba.ok()) img.rgba = std::move(rgba).value();
  render::OffscreenTarget::bind_default();
  img.width = width;
  img.height = height;
  // KVSCOPE_TEST_DUMP=DIR saves every rendered test image for a human to look at.
  if (const char* dir = std::getenv("KVSCOPE_TEST_DUMP")) {
    static int counter = 0;
    std::string path = std::string(dir) + "/render_" + std::to_string(counter++) + ".png";
    (void)render::write_png(path, width, height, img.rgba);
  }
  return img;
}

std::string pixel_note(const Image& img, glm::vec2 c) {
  const int x = int(c.x), y = int(c.y);
  if (!img.inside(x, y))
    return " (pixel " + std::to_string(x) + "," + std::to_string(y) + ": outside)";
  const glm::vec3 p = img.at(x, y);
  char buf[80];
  std::snprintf(buf, sizeof buf, " (pixel %d,%d: %.2f %.2f %.2f)", x, y, double(p.r), double(p.g),
                double(p.b));
  return buf;
}

glm::vec2 to_screen(const render::Scene& s, glm::vec3 world, int width, int height) {
  return to_screen(s.camera, world, width, height);
}

glm::vec2 to_screen(const render::CameraView& v, glm::vec3 world, int width, int height) {
  // From the camera's own numbers and glm, not render::project_to_screen (the code under
  // test): a right-handed look-at view, an OpenGL perspective (depth -1..1) of the camera's
  // vertical field of view and the image's aspect, then NDC to pixels with y down.
  const glm::mat4 view = glm::lookAt(v.eye, v.target, v.up);
  const glm::mat4 proj = glm::perspective(glm::radians(v.fov_y_deg), float(width) / float(height),
                                          v.near_plane, v.far_plane);
  const glm::vec4 clip = proj * view * glm::vec4(world, 1.0f);
  EXPECT_GT(clip.w, 1e-6f) << "behind the camera";
  if (clip.w <= 1e-6f) return glm::vec2(-1.0f);
  const glm::vec2 ndc(clip.x / clip.w, clip.y / clip.w);
  return {(ndc.x + 1.0f) * 0.5f * float(width), (1.0f - ndc.y) * 0.5f * float(height)};
}

}  // namespace kvscope::test
