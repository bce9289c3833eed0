// test_scene_kv_error.cpp — the KV blocks coloured by the quantization error of their rows,
// from hand-built step results (no window, no model):
//   - the colour scale is monotone on a log scale, clamped at both ends, and the colour
//     goes from dark navy (small errors) to bright magenta and pale pink (large ones), never
//     near the generated tokens' orange or NO CACHE's red;
//   - with the option on, each block's colour is kv_error_color of the error measured for
//     its layer and position (K, or V with color_by_v), so a larger error reads brighter;
//   - the hover tooltip's line gives the block's measured error;
//   - blocks with no measurement are grey, and the option off leaves the norm colouring.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "app/core/timeline.h"
#include "app/scene/scene_builder.h"
#include "app/scene/scene_kv.h"
#include "render/synthetic_scene.h"
#include "tests/render/expected_layout.h"

namespace kvscope::app {
namespace {

namespace layout = kvscope::test::expected_layout;
constexpr int kL = 2, kPrompt = 5;

// Errors made up per layer and position: 10^-(4 - pos * 0.7) (0.01% .. 30%), V twice K.
float k_error(int pos, int layer) {
  return std::pow(10.0f, -4.0f + 0.7f * float(pos)) * (1 + layer);
}

// Step 1 prefills positions 0..4 and measures their errors; step 2 writes position 5
// without a measurement (the option was off then).
Timeline measured_run() {
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  reset.prompt_text = "errors";
  tl.apply(reset);
  for (int step = 1; step <= 2; ++step) {
    auto t = std::make_shared<StepTrace>();
    t->step = step;
    t->pos = kPrompt + step - 1;
    t->token_id = 50 + step;
    if (step == 1)
      for (int i = 0; i < kPrompt; ++i) t->prompt.push_back({i, " p" + std::to_string(i)});
    t->n_layer = kL;
    t->n_head = 1;
    t->kv_first_pos = step == 1 ? 0 : kPrompt;
    t->kv_written = step == 1 ? kPrompt : 1;
    for (int l = 0; l < kL; ++l)
      for (int i = 0; i < t->kv_written; ++i) {
        t->k_norm.push_back(1.0f + 0.1f * float(i));
        if (step == 1) {
          t->k_err.push_back(k_error(i, l));
          t->v_err.push_back(2.0f * k_error(i, l));
        }
      }
    t->v_norm = t->k_norm;
    t->kv_layers.resize(kL);
    for (auto& ks : t->kv_layers) ks.held = {{0, t->kv_first_pos + t->kv_written}};
    t->seq_len = t->pos + 1;
    Event e{Event::Kind::Step, 1};
    e.trace = t;
    tl.apply(e);
  }
  return tl;
}

std::map<std::pair<int, int>, glm::vec3> block_colors(const render::Scene& s) {
  std::map<std::pair<int, int>, glm::vec3> out;  // (pos, layer) -> colour
  for (const auto& k : s.kv_blocks) {
    const int pos = int(std::lround(k.position.x / layout::kTokenSpacing));
    const int layer = int(std::lround((layout::kKvTop - k.position.y) / layout::kKvPitch));
    out[{pos, layer}] = k.color;
  }
  return out;
}

render::Scene scene(const Timeline& tl, bool by_error, bool by_v) {
  ViewOptions v;
  v.layer = 0;
  v.n_head_kv = 1;
  v.color_by_error = by_error;
  v.color_by_v = by_v;
  AnimClock c;
  c.since_step = 5.0;
  return build_scene(tl, v, c);
}

TEST(KvErrorColor, ScaleIsMonotoneOnALogScaleAndNeverTheTokensOrange) {
  EXPECT_EQ(kv_error_scale(0.0f), 0.0f);
  EXPECT_EQ(kv_error_scale(kKvErrorLow), 0.0f);
  EXPECT_NEAR(kv_error_scale(kKvErrorHigh), 1.0f, 1e-6f);
  EXPECT_EQ(kv_error_scale(0.9f), 1.0f);
  float prev = -1.0f;
  for (float e = 1e-4f; e < 0.3f; e *= 1.5f) {
    EXPECT_GT(kv_error_scale(e), prev) << e;
    prev = kv_error_scale(e);
  }
  // Equal ratios, equal steps: 1e-3 -> 1e-2 is as far as 1e-2 -> 1e-1.
  EXPECT_NEAR(kv_error_scale(1e-2f) - kv_error_scale(1e-3f),
              kv_error_scale(1e-1f) - kv_error_scale(1e-2f), 1e-5f);
  const glm::vec3 lo = kv_error_color(1e-4f), hi = kv_error_color(0.3f);
  EXPECT_GT(lo.b, lo.r) << "small errors are blue";
  EXPECT_GT(hi.r + hi.g + hi.b, 2.0f * (lo.r + lo.g + lo.b)) << "large ones bright";
  // Nowhere on the scale a colour that reads as the token's orange or the recompute red:
  // blue never falls far below red, and every colour is far from the token's.
  const glm::vec3 token = render::palette::kGeneratedToken;
  for (float e = 1e-5f; e < 1.0f; e *= 1.2f) {
    const glm::vec3 c = kv_error_color(e);
    EXPECT_GT(c.b, c.r - 0.1f) << "orange or red at " << e;
    EXPECT_GT(glm::length(c - token), 0.5f) << "too close to the token colour at " << e;
  }
}

TEST(KvErrorColor, EachBlockFollowsTheErrorMeasuredForItsRows) {
  const Timeline tl = measured_run();
  const auto by_k = block_colors(scene(tl, true, false));
  const auto by_v = block_colors(scene(tl, true, true));
  const auto by_norm = block_colors(scene(tl, false, false));
  for (int l = 0; l < kL; ++l) {
    float prev_bright = -1.0f;
    for (int p = 0; p < kPrompt; ++p) {
      ASSERT_TRUE(by_k.count({p, l})) << p << " " << l;
      const glm::vec3 want_k = kv_error_color(k_error(p, l)),
                      want_v = kv_error_color(2.0f * k_error(p, l));
      for (int i = 0; i < 3; ++i) {
        EXPECT_FLOAT_EQ(by_k.at({p, l})[i], want_k[i]) << "pos " << p << " layer " << l;
        EXPECT_FLOAT_EQ(by_v.at({p, l})[i], want_v[i]) << "pos " << p << " layer " << l;
      }
      // Brighter as the error grows.
      const glm::vec3 c = by_k.at({p, l});
      const float bright = c.r + c.g + c.b;
      EXPECT_GT(bright, prev_bright) << "pos " << p << " layer " << l;
      prev_bright = bright;
    }
    // Position 5 was written without a measurement: grey.
    const glm::vec3 grey = by_k.at({kPrompt, l});
    EXPECT_EQ(grey, kKvErrorUnmeasured);
  }
  // Off: the norm colouring, which knows nothing of the errors.
  EXPECT_NE(by_norm.at({0, 0}), by_k.at({0, 0}));
  EXPECT_NE(by_norm.at({kPrompt, 0}), kKvErrorUnmeasured);
}

// Hovering a token says what its block's rows lost to quantization in the layer shown.
TEST(KvErrorColor, TheHoverTextGivesTheBlocksError) {
  const Timeline tl = measured_run();
  // Position 2, layer 1: K 10^-2.6 * 2 = 0.5%, V twice that.
  const std::string text = kv_error_text(tl, 2, 1);
  EXPECT_NE(text.find("K 0.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("V 1%"), std::string::npos) << text;
  EXPECT_NE(text.find("layer 1"), std::string::npos) << text;
  EXPECT_EQ(kv_error_text(tl, kPrompt, 0), "") << "not measured: nothing to say";
}

TEST(KvErrorColor, TimelineKeepsTheErrorsPerLayerAndPosition) {
  const Timeline tl = measured_run();
  for (int l = 0; l < kL; ++l)
    for (int p = 0; p < kPrompt; ++p) {
      EXPECT_FLOAT_EQ(tl.kv_error(p, l, false), k_error(p, l));
      EXPECT_FLOAT_EQ(tl.kv_error(p, l, true), 2.0f * k_error(p, l));
    }
  EXPECT_TRUE(std::isnan(tl.kv_error(kPrompt, 0, false))) << "not measured";
  EXPECT_TRUE(std::isnan(tl.kv_error(kPrompt + 1, 0, false))) << "not computed";
}

}  // namespace
}  // namespace kvscope::app
