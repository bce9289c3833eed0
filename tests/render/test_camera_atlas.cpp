// test_camera_atlas.cpp — camera presets/framing and glyph atlas (no GL needed).
#include <gtest/gtest.h>

#include <cmath>

#include "render/camera.h"
#include "render/glyph_atlas.h"
#include "render/layout.h"

using render::Camera;
using render::CameraPreset;

TEST(Camera, PresetNamesRoundTrip) {
  for (CameraPreset p : render::kAllCameraPresets)
    EXPECT_EQ(render::parse_camera_preset(render::camera_preset_name(p)), p);
  EXPECT_EQ(render::parse_camera_preset("TOP"), CameraPreset::Top);
  EXPECT_EQ(render::parse_camera_preset("34"), CameraPreset::ThreeQuarter);
  EXPECT_FALSE(render::parse_camera_preset("diagonal").has_value());
}

TEST(Camera, TopLooksStraightDownWithXToTheRight) {
  Camera cam;
  cam.set_content({{0, -3, -1}, {10, 3, 1}}, {10, 1.6f, 0});
  cam.set_preset(CameraPreset::Top, true);
  render::CameraView v = cam.view();
  glm::vec3 dir = glm::normalize(v.target - v.eye);
  EXPECT_LT(dir.y, -0.999f);
  auto a = render::project_to_screen(v, {0, 0, 0}, 800, 450);
  auto b = render::project_to_screen(v, {10, 0, 0}, 800, 450);
  ASSERT_TRUE(a && b);
  EXPECT_GT(b->x - a->x, 100.0f);
  EXPECT_LT(std::abs(b->y - a->y), 2.0f);
}

TEST(Camera, FramingKeepsTheHeadInViewAsTheSequenceGrows) {
  for (CameraPreset p : render::kAllCameraPresets) {
    Camera cam;
    cam.set_aspect(16.0f / 9.0f);
    cam.set_preset(p, true);
    for (int n : {1, 10, 100, 1000, 4000}) {
      glm::vec3 head = render::layout::head_position(n);
      cam.set_content({{-0.5f, -6.0f, -0.5f}, {float(n), 3.0f, 0.5f}}, head);
      for (int i = 0; i < 120; ++i) cam.update(1.0f / 60.0f);  // two seconds of frames
      auto s = render::project_to_screen(cam.view(), head, 1280, 720);
      ASSERT_TRUE(s.has_value()) << render::camera_preset_name(p) << " n=" << n;
      EXPECT_GE(s->x, 0.0f) << render::camera_preset_name(p) << " n=" << n;
      EXPECT_LE(s->x, 1280.0f) << render::camera_preset_name(p) << " n=" << n;
      EXPECT_GE(s->y, 0.0f) << render::camera_preset_name(p) << " n=" << n;
      EXPECT_LE(s->y, 720.0f) << render::camera_preset_name(p) << " n=" << n;
    }
  }
}

TEST(Camera, TransitionsAreSmoothAndUserInputStopsAutoFraming) {
  Camera cam;
  cam.set_content({{0, -3, -1}, {20, 3, 1}}, {20, 1.6f, 0});
  cam.set_preset(CameraPreset::Side, true);
  float yaw0 = cam.current().yaw_deg;
  cam.set_preset(CameraPreset::Front);
  cam.update(1.0f / 60.0f);
  float yaw1 = cam.current().yaw_deg;
  EXPECT_GT(yaw1, yaw0);
  EXPECT_LT(yaw1, cam.goal().yaw_deg);  // not there in one frame
  for (int i = 0; i < 300; ++i) cam.update(1.0f / 60.0f);
  EXPECT_NEAR(cam.current().yaw_deg, cam.goal().yaw_deg, 0.05f);
  EXPECT_TRUE(cam.auto_framing());
  cam.orbit(10, 5);
  EXPECT_FALSE(cam.auto_framing());
  float d = cam.goal().distance;
  cam.zoom(2);
  EXPECT_LT(cam.goal().distance, d);
  cam.set_preset(CameraPreset::Top);
  EXPECT_TRUE(cam.auto_framing());
}

TEST(GlyphAtlas, BakesDejaVuAndLaysOutText) {
  std::string font = render::GlyphAtlas::find_default_font();
  if (font.empty()) GTEST_SKIP() << "DejaVu Sans not installed";
  render::GlyphAtlas atlas;
  render::Result r = render::GlyphAtlas::bake(font, 40, 1024, &atlas);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_GT(atlas.glyph_count(), 500u);
  std::vector<render::GlyphQuad> q;
  float w_short = atlas.layout("ab", &q);
  EXPECT_EQ(q.size(), 2u);
  float w_long = atlas.layout(" kingdom", nullptr);
  EXPECT_GT(w_long, 3 * w_short);
  q.clear();
  atlas.layout("\xE4\xB8\xAD", &q);  // a CJK character DejaVu lacks: drawn as '?'
  EXPECT_EQ(q.size(), 1u);
  q.clear();
  atlas.layout("\xC3", &q);  // truncated UTF-8 does not crash and draws a replacement
  EXPECT_EQ(q.size(), 1u);
  EXPECT_FALSE(render::GlyphAtlas::bake("/nonexistent.ttf", 40, 1024, &atlas).ok());
}
