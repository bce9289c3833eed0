// test_camera_atlas.cpp — camera presets/framing and glyph atlas (no GL needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <glm/trigonometric.hpp>

#include "render/camera.h"
#include "render/glyph_atlas.h"
#include "render/layout.h"
#include "render/synthetic_scene.h"
#include "tests/render/expected_layout.h"

namespace render = kvscope::render;
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

namespace {

// A settled camera for a synthetic scene of n tokens framed by `p` at `aspect`.
render::Scene framed_scene(int n, CameraPreset p, float aspect, Camera* cam) {
  render::SyntheticSpec spec;
  spec.n_tokens = n;
  spec.n_layers = 6;
  render::Scene s = render::make_synthetic_scene(spec);
  s.anim.beam_arc = render::preset_beam_arc(p);
  cam->set_aspect(aspect);
  cam->set_ground(s.grid.height);
  cam->set_content(render::framing_content(s, s.anim.beam_arc));
  cam->set_preset(p, true);
  s.camera = cam->view();
  return s;
}

bool on_screen(const render::CameraView& v, glm::vec3 p, int w, int h) {
  auto s = render::project_to_screen(v, p, w, h);
  return s && s->x >= 0 && s->y >= 0 && s->x <= w && s->y <= h;
}

}  // namespace

TEST(Camera, TopFramesEveryBeamOfALongSequenceAtAnyAspect) {
  for (int n : {20, 300, 2000})
    for (float aspect : {0.8f, 1.1f, 16.0f / 9.0f, 3.0f}) {
      Camera cam;
      render::Scene s = framed_scene(n, CameraPreset::Top, aspect, &cam);
      int w = int(720 * aspect), h = 720;
      for (const render::Beam& b : s.beams) {
        EXPECT_TRUE(on_screen(s.camera, b.to, w, h)) << "n=" << n << " aspect " << aspect;
        EXPECT_TRUE(on_screen(s.camera, render::beam_apex(b.from, b.to, s.anim.beam_arc), w, h))
            << "n=" << n << " aspect " << aspect;
      }
      EXPECT_TRUE(on_screen(s.camera, s.head.position, w, h));
    }
}

TEST(Camera, RecentPresetsFrameTheHeadAndTheLastTokens) {
  for (CameraPreset p :
       {CameraPreset::Side, CameraPreset::Front, CameraPreset::ThreeQuarter, CameraPreset::Follow})
    for (int n : {5, 300, 2000}) {
      Camera cam;
      render::Scene s = framed_scene(n, p, 1.1f, &cam);
      const char* name = render::camera_preset_name(p);
      EXPECT_TRUE(on_screen(s.camera, s.head.position, 792, 720)) << name << " n=" << n;
      for (int back = 1; back <= std::min(n, 8); ++back)
        EXPECT_TRUE(on_screen(s.camera, render::layout::token_position(n - back), 792, 720))
            << name << " n=" << n << " token " << n - back;
      // Long sequences: the preset shows the recent part, not a thin line of everything.
      if (n == 2000) {
        auto a =
            render::project_to_screen(s.camera, render::layout::token_position(n - 1), 792, 720);
        auto b =
            render::project_to_screen(s.camera, render::layout::token_position(n - 2), 792, 720);
        ASSERT_TRUE(a && b);
        EXPECT_GT(glm::length(*a - *b), 8.0f) << name << ": neighbouring tokens too close to read";
      }
    }
}

TEST(Camera, ZoomGoesTowardThePointer) {
  Camera cam;
  render::Scene s = framed_scene(40, CameraPreset::ThreeQuarter, 16.0f / 9.0f, &cam);
  // The point of the target plane under the pointer at NDC (0.5, -0.3) stays there.
  const glm::vec2 ndc(0.5f, -0.3f);
  render::CameraView v0 = cam.view();
  glm::vec3 fwd = glm::normalize(v0.target - v0.eye);
  glm::vec3 right = glm::normalize(glm::cross(fwd, v0.up)), up = glm::cross(right, fwd);
  float dist = glm::length(v0.target - v0.eye), t = std::tan(glm::radians(v0.fov_y_deg) * 0.5f);
  glm::vec3 p = v0.target + right * (ndc.x * t * (16.0f / 9.0f) * dist) + up * (ndc.y * t * dist);
  auto before = render::project_to_screen(v0, p, 1600, 900);
  cam.zoom_at(3.0f, ndc);
  cam.update(0.0f);
  auto after = render::project_to_screen(cam.view(), p, 1600, 900);
  ASSERT_TRUE(before && after);
  EXPECT_NEAR(after->x, before->x, 1.0f);
  EXPECT_NEAR(after->y, before->y, 1.0f);
  EXPECT_LT(glm::length(cam.view().eye - p), glm::length(v0.eye - p));  // closer to it
}

TEST(Camera, NeverGoesBelowTheGround) {
  Camera cam;
  render::Scene s = framed_scene(40, CameraPreset::Side, 16.0f / 9.0f, &cam);
  const float ground = s.grid.height;
  cam.orbit(0.0f, -80.0f);  // drag down hard
  for (int i = 0; i < 120; ++i) {
    cam.update(1.0f / 60.0f);
    EXPECT_GE(cam.view().eye.y, ground) << "frame " << i;
  }
  cam.pan(0.0f, -5.0f);
  cam.zoom_at(-10.0f, glm::vec2(0.0f, -0.9f));
  for (int i = 0; i < 120; ++i) cam.update(1.0f / 60.0f);
  EXPECT_GE(cam.view().eye.y, ground);
  EXPECT_GE(cam.view().target.y, ground);
}

TEST(Camera, FollowKeepsTrackingTheHeadWhileTheUserZoomsAndOrbits) {
  Camera cam;
  render::Scene s = framed_scene(30, CameraPreset::Follow, 16.0f / 9.0f, &cam);
  cam.zoom_at(2.0f, glm::vec2(0.3f, 0.2f));
  cam.orbit(15.0f, 5.0f);
  EXPECT_TRUE(cam.auto_framing());
  for (int n = 31; n < 60; ++n) {
    render::SyntheticSpec spec;
    spec.n_tokens = n;
    render::Scene next = render::make_synthetic_scene(spec);
    cam.set_content(render::framing_content(next, next.anim.beam_arc));
    for (int i = 0; i < 10; ++i) cam.update(1.0f / 60.0f);
  }
  for (int i = 0; i < 120; ++i) cam.update(1.0f / 60.0f);
  EXPECT_TRUE(on_screen(cam.view(), render::layout::head_position(59), 1600, 900));
  EXPECT_TRUE(on_screen(cam.view(), render::layout::token_position(58), 1600, 900));
}

TEST(Camera, PresetTransitionsMoveInSmallStepsEveryFrame) {
  Camera cam;
  framed_scene(300, CameraPreset::Top, 16.0f / 9.0f, &cam);
  glm::vec3 start = cam.view().eye;
  cam.set_preset(CameraPreset::Follow);
  glm::vec3 prev = start;
  float longest = 0, total = 0;
  for (int i = 0; i < 180; ++i) {
    cam.update(1.0f / 60.0f);
    glm::vec3 e = cam.view().eye;
    longest = std::max(longest, glm::length(e - prev));
    total += glm::length(e - prev);
    prev = e;
  }
  EXPECT_TRUE(cam.settled());
  EXPECT_LT(longest, 0.12f * total);  // no frame jumps a large part of the way
}

TEST(GlyphAtlas, BakesDejaVuAndLaysOutText) {
  std::string font = render::GlyphAtlas::find_default_font();
  if (font.empty()) GTEST_SKIP() << "DejaVu Sans not installed";
  auto baked = render::GlyphAtlas::bake(font, 40, 1024);
  ASSERT_TRUE(baked.ok()) << baked.error().message;
  const render::GlyphAtlas& atlas = *baked;
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
  EXPECT_FALSE(render::GlyphAtlas::bake("/nonexistent.ttf", 40, 1024).ok());
}

// The scene's geometry as documented (tests/render/expected_layout.h, which the pixel tests
// take their expected positions from): a change to render::layout shows here by name.
TEST(LayoutSpec, ProductionLayoutMatchesTheSpec) {
  namespace spec = kvscope::test::expected_layout;
  namespace layout = render::layout;
  EXPECT_EQ(layout::kTokenSpacing, spec::kTokenSpacing);
  EXPECT_EQ(layout::kKvTop, spec::kKvTop);
  EXPECT_EQ(layout::kKvPitch, spec::kKvPitch);
  EXPECT_EQ(layout::kHeadHeight, spec::kHeadHeight);
  EXPECT_EQ(layout::kKvWidth, spec::kKvWidth);
  EXPECT_EQ(layout::kKvHeadFill, spec::kKvHeadFill);
  for (int pos : {0, 1, 7, 300}) {
    EXPECT_EQ(layout::token_position(pos), spec::token_position(pos)) << pos;
    EXPECT_EQ(layout::head_position(pos), spec::head_position(pos)) << pos;
    for (int l : {0, 3, 29}) {
      EXPECT_EQ(layout::kv_block_position(pos, l), spec::kv_block_position(pos, l));
      for (int n : {1, 3, 8})
        for (int h = 0; h < n; ++h) {
          const glm::vec3 a = layout::kv_head_position(pos, l, h, n);
          const glm::vec3 b = spec::kv_head_position(pos, l, h, n);
          EXPECT_NEAR(a.x, b.x, 1e-6f * (1.0f + std::fabs(b.x))) << pos << " " << l << " " << h << "/" << n;
          EXPECT_EQ(a.y, b.y);
        }
    }
  }
}
