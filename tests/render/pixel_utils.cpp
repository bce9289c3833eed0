// pixel_utils.cpp — offscreen render + camera framing helpers for pixel tests.
#include "pixel_utils.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

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

glm::vec2 to_screen(const render::Scene& s, glm::vec3 world, int width, int height) {
  auto p = render::project_to_screen(s.camera, world, width, height);
  EXPECT_TRUE(p.has_value());
  return p.value_or(glm::vec2(-1.0f));
}

}  // namespace kvscope::test
