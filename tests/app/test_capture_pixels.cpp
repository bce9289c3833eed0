// test_capture_pixels.cpp — frames built from the real engine's traces: one token
// column per position, beams as bright as the engine's attention, red recompute blocks
// in NO CACHE only.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "app/core/engine_setup.h"
#include "app/scene/capture.h"
#include "gl_test_context.h"
#include "pixel_utils.h"
#include "tests/render/expected_layout.h"

// Expected positions come from the documented geometry, not render::layout.
namespace expected_layout = kvscope::test::expected_layout;

using namespace kvscope;
using namespace kvscope::app;
using kvscope::test::Image;

namespace {

constexpr int kW = 1280, kH = 720;
const PromptSpec kPrompt{"Once upon a time, in a kingdom far away, there lived", false};

bool run_engine(CacheMode mode, int steps, Timeline* tl) {
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  eo.mode = mode;
  auto eng = open_engine(eo);
  EXPECT_TRUE(eng.ok()) << (eng.ok() ? "" : eng.error().message);
  if (!eng.ok()) return false;
  Status st = run_steps(*eng.value().session, kPrompt, steps, tl);
  EXPECT_TRUE(st.ok()) << st.message();
  return st.ok();
}

Image to_image(const std::vector<uint8_t>& rgba) {
  return Image{kW, kH, rgba};
}

Image render_frame(render::Renderer& r, const render::Scene& s) {
  auto px = render_offscreen(r, s, kW, kH);
  EXPECT_TRUE(px.ok());
  return px.ok() ? to_image(px.value()) : Image{};
}

float luminance(glm::vec3 c) {
  return 0.2126f * c.r + 0.7152f * c.g + 0.0722f * c.b;
}
bool is_red(glm::vec3 c) {
  return c.r > 0.55f && c.g < 0.22f && c.b < 0.22f;
}
int count_red(const Image& img) {
  int n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) n += is_red(img.at(x, y));
  return n;
}

}  // namespace

class CapturePixels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model not found";
  }
};

TEST_F(CapturePixels, TokenColumnsEqualSeqLen) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl;
  ASSERT_TRUE(run_engine(CacheMode::Cache, 10, &tl));
  ViewOptions view;
  view.labels = false;
  render::Scene s = capture_scene(tl, view, 2.0, render::CameraPreset::Top, kW, kH);
  s.beams.clear();
  s.head.visible = false;
  s.grid.visible = false;
  Image img = render_frame(*r, s);
  int seq_len = tl.last()->seq_len;
  ASSERT_EQ(int(s.tokens.size()), seq_len);
  // Top faces: prompt tokens have one shade, generated tokens another.
  auto top = [&](int pos) {
    return kvscope::test::to_screen(s, expected_layout::token_position(pos) + glm::vec3(0, 0.4f, 0),
                                    kW, kH);
  };
  glm::vec2 p0 = top(0), pn = top(seq_len - 1);
  glm::vec3 prompt_face = img.at(int(p0.x), int(p0.y)), gen_face = img.at(int(pn.x), int(pn.y));
  auto near = [](glm::vec3 a, glm::vec3 b) {
    return std::max({std::abs(a.r - b.r), std::abs(a.g - b.g), std::abs(a.b - b.b)}) < 0.05f;
  };
  int runs = kvscope::test::count_runs(img, false, int(p0.y), [&](glm::vec3 c) {
    return near(c, prompt_face) || near(c, gen_face);
  });
  EXPECT_EQ(runs, seq_len);
}

TEST_F(CapturePixels, BeamBrightnessFollowsEngineAttention) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl;
  ASSERT_TRUE(run_engine(CacheMode::Cache, 6, &tl));
  for (auto [layer, head] : {std::pair{3, 2}, std::pair{15, 0}, std::pair{29, 5}}) {
    ViewOptions view;
    view.layer = layer;
    view.head = head;
    view.aggregation = HeadAggregation::Single;
    view.labels = false;
    render::Scene s = capture_scene(tl, view, 2.0, render::CameraPreset::Side, kW, kH);
    s.tokens.clear();
    s.kv_blocks.clear();
    s.head.visible = false;
    s.grid.visible = false;
    Image img = render_frame(*r, s);
    std::vector<float> w = beam_weights(*tl.last(), view);
    ASSERT_EQ(w.size(), s.beams.size());
    float mx = *std::max_element(w.begin(), w.end());
    std::vector<float> seen;
    for (const render::Beam& b : s.beams) {
      glm::vec2 px = kvscope::test::to_screen(s, b.to + glm::vec3(0, 0.08f, 0), kW, kH);
      float best = 0;
      for (int dy = -4; dy <= 4; ++dy)
        for (int dx = -4; dx <= 4; ++dx)
          if (img.inside(int(px.x) + dx, int(px.y) + dy))
            best = std::max(best, luminance(img.at(int(px.x) + dx, int(px.y) + dy)));
      seen.push_back(best);
    }
    int checked = 0;
    for (size_t i = 0; i < w.size(); ++i)
      for (size_t j = 0; j < w.size(); ++j)
        if (w[i] / mx > w[j] / mx + 0.2f) {
          ++checked;
          EXPECT_GT(seen[i], seen[j])
              << "layer " << layer << " head " << head << ": pos " << i << " (w " << w[i]
              << ") vs pos " << j << " (w " << w[j] << ")";
        }
    EXPECT_GT(checked, 0) << "attention too flat to compare at layer " << layer;
  }
}

TEST_F(CapturePixels, NoCacheShowsRedRecomputeBlocksCacheDoesNot) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline cached, recomputed;
  ASSERT_TRUE(run_engine(CacheMode::Cache, 5, &cached));
  ASSERT_TRUE(run_engine(CacheMode::NoCache, 5, &recomputed));
  ViewOptions view;
  int red_cache = count_red(render_frame(
      *r, capture_scene(cached, view, 0.45, render::CameraPreset::ThreeQuarter, kW, kH)));
  int red_nocache = count_red(render_frame(
      *r, capture_scene(recomputed, view, 0.45, render::CameraPreset::ThreeQuarter, kW, kH)));
  EXPECT_LT(red_cache, 100);
  EXPECT_GT(red_nocache, 20000);
}
