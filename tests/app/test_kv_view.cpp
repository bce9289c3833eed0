// test_kv_view.cpp — the KV cache as the scene shows it, from hand-built traces:
//   - a windowed layer's blocks older than its window are absent (in the scene and in the
//     pixels) while a global layer's stay; the ones evicted by the step shown leave with an
//     animation (drawn at its start, gone at its end); the window boundary is drawn;
//   - each KV block splits into the model's KV heads, and choosing a query head lights
//     exactly the KV head it reads (H / Hkv query heads per KV head);
//   - a quantized cache type hatches the blocks;
// and the view polish: TOP's flat labels are readable and never overlap at 1280x720 with
// 2,000 tokens, the overview strip marks the strongest targets however long the run, and
// the no-GPU notice is one sentence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "app/scene/overview_marks.h"
#include "app/scene/scene_kv.h"
#include "app/ui/app_capture.h"
#include "engine/bootstrap/bootstrap.h"
#include "gl_test_context.h"
#include "pixel_utils.h"
#include "render/offscreen.h"
#include "synthetic_run.h"
#include "tests/render/expected_layout.h"

using namespace kvscope;
using namespace kvscope::app;
using kvscope::test::Image;
using kvscope::test::synthetic_run;
using kvscope::test::SyntheticRun;

namespace {

namespace layout = kvscope::test::expected_layout;

// Where a KV block instance sits: position, layer and KV head (of n_heads).
struct BlockAt {
  int pos, layer, head;
};
BlockAt block_at(const render::KvBlockInstance& k, int n_heads) {
  BlockAt b;
  b.pos = int(std::lround(k.position.x / layout::kTokenSpacing));
  b.layer = int(std::lround((layout::kKvTop - k.position.y) / layout::kKvPitch));
  const float off = k.position.x - float(b.pos) * layout::kTokenSpacing + 0.5f * layout::kKvWidth;
  b.head = std::clamp(int(off / (layout::kKvWidth / float(n_heads))), 0, n_heads - 1);
  return b;
}

// A Gemma-like stack: 6 layers, the last global, the others windowed at 8 positions.
SyntheticRun gemma_like(int n_tokens) {
  SyntheticRun r;
  r.n_tokens = n_tokens;
  r.n_layer = 6;
  r.n_head = 4;
  r.window = {8, 8, 8, 8, 8, 0};
  return r;
}

ViewOptions view_with(int n_head_kv) {
  ViewOptions v;
  v.layer = 0;
  v.n_head_kv = n_head_kv;
  return v;
}

AnimClock settled() {
  AnimClock c;
  c.since_step = 5.0;
  return c;
}

// A camera in front of the stacks (+z), level with them, looking at position `pos`.
render::CameraView front_camera(float x, float y, float distance) {
  render::CameraView c;
  c.target = {x, y, 0.0f};
  c.eye = {x, y, distance};
  c.fov_y_deg = 40.0f;
  return c;
}

float luma(glm::vec3 c) {
  return 0.3f * c.r + 0.55f * c.g + 0.15f * c.b;
}

// Mean colour of the 3x3 pixels around where `world` projects.
glm::vec3 sample(const Image& img, const render::Scene& s, glm::vec3 world) {
  glm::vec2 p = kvscope::test::to_screen(s, world, img.width, img.height);
  glm::vec3 sum(0.0f);
  int n = 0;
  for (int dy = -1; dy <= 1; ++dy)
    for (int dx = -1; dx <= 1; ++dx)
      if (img.inside(int(p.x) + dx, int(p.y) + dy)) {
        sum += img.at(int(p.x) + dx, int(p.y) + dy);
        ++n;
      }
  return n ? sum / float(n) : sum;
}

bool near_background(glm::vec3 c, const render::Scene& s) {
  return std::max({std::abs(c.r - s.background.r), std::abs(c.g - s.background.g),
                   std::abs(c.b - s.background.b)}) < 0.05f;
}

}  // namespace

// ---------------------------------------------------------------- evictions (scene level)

TEST(KvScene, WindowedLayersDropOldPositionsGlobalLayersKeepThem) {
  const int T = 40;
  Timeline tl = synthetic_run(gemma_like(T));
  const StepTrace* last = tl.last();
  ASSERT_NE(last, nullptr);
  const int computed = last->kv_first_pos + last->kv_written;  // 39
  const int start = computed - 8;                              // the window's oldest position
  render::Scene s = build_scene(tl, view_with(1), settled());
  std::map<std::pair<int, int>, const render::KvBlockInstance*> at;  // (pos, layer) -> block
  for (const auto& k : s.kv_blocks) {
    BlockAt b = block_at(k, 1);
    ASSERT_EQ(at.count(std::pair{b.pos, b.layer}), 0u) << "two blocks at one place";
    at[{b.pos, b.layer}] = &k;
  }
  for (int pos = 0; pos < T; ++pos) {
    // The global layer holds every position (the newest one has a placeholder block).
    EXPECT_EQ(at.count(std::pair{pos, 5}), 1u) << "global layer lost position " << pos;
    for (int l = 0; l < 5; ++l) {
      const bool held = pos >= start;
      const bool evicted_now = pos == start - 1;  // the step moved the window by one
      if (held) {
        ASSERT_EQ(at.count(std::pair{pos, l}), 1u) << "layer " << l << " position " << pos;
        EXPECT_EQ((at[{pos, l}]->leave), 0.0f);
      } else if (evicted_now) {
        ASSERT_EQ(at.count(std::pair{pos, l}), 1u) << "the block evicted now is drawn leaving";
        EXPECT_EQ((at[{pos, l}]->leave), 1.0f);
      } else {
        EXPECT_EQ(at.count(std::pair{pos, l}), 0u)
            << "layer " << l << " still shows evicted " << pos;
      }
    }
  }
  // The window boundary: a plate at each windowed layer's row just before `start`, and
  // one strip on the floor; none for the global layer.
  int plates = 0, floors = 0;
  for (const render::MarkerInstance& m : s.markers) {
    EXPECT_NEAR(m.center.x, float(start) - 0.5f, 1e-4f);
    if (m.center.y < layout::kv_block_position(0, 5).y - 0.2f)
      ++floors;
    else
      ++plates;
  }
  EXPECT_EQ(plates, 5);
  EXPECT_EQ(floors, 1);
  // The leave animation runs with the step's clock: 0 right after the step, 1 when settled.
  EXPECT_EQ(s.anim.leave, 1.0f);
  AnimClock now;
  now.since_step = 0.0;
  EXPECT_EQ(build_scene(tl, view_with(1), now).anim.leave, 0.0f);
}

TEST(KvScene, SinkAndWindowKeepTheFirstPositionsAndMarkBothEdges) {
  SyntheticRun r = gemma_like(40);
  r.sink = 4;
  Timeline tl = synthetic_run(r);
  KvHoldings hold(tl.last(), previous_trace(tl));
  for (int l = 0; l < 5; ++l) {
    EXPECT_EQ(hold.sink_end(l), 4);
    EXPECT_EQ(hold.window_start(l), 31);
    for (int pos : {0, 3}) EXPECT_EQ(hold.slot(l, pos), KvSlot::Held);
    EXPECT_EQ(hold.slot(l, 4), KvSlot::Gone);
    EXPECT_EQ(hold.slot(l, 30), KvSlot::Leaving);
  }
  EXPECT_EQ(hold.window_start(5), -1);
  render::Scene s = build_scene(tl, view_with(1), settled());
  int sink_plates = 0;
  for (const auto& m : s.markers) sink_plates += std::abs(m.center.x - 3.5f) < 1e-4f;
  EXPECT_EQ(sink_plates, 5);
}

TEST(KvScene, NoCacheAndTracesWithoutCacheInformationShowEveryComputedPosition) {
  SyntheticRun r = gemma_like(30);
  r.mode = CacheMode::NoCache;
  Timeline tl = synthetic_run(r);
  render::Scene s = build_scene(tl, view_with(1), settled());
  EXPECT_EQ(s.kv_blocks.size(), size_t(30 * 6));
  EXPECT_TRUE(s.markers.empty());
}

// ---------------------------------------------------------------- evictions (pixels)

TEST(KvScenePixels, EvictedBlocksAreGoneFromTheImageGlobalOnesAreThere) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_run(gemma_like(40));
  const int W = 960, H = 360;
  const int old_pos = 20, leaving_pos = 30, start = 31;
  for (double since : {0.0, 5.0}) {
    AnimClock clock;
    clock.since_step = since;
    render::Scene s = build_scene(tl, view_with(1), clock);
    s.labels_vertical = true;
    s.grid.visible = false;
    const float mid_y = layout::kv_block_position(0, 3).y;
    s.camera = front_camera(26.0f, mid_y, 9.0f);
    Image img = kvscope::test::render_image(*r, s, W, H);
    for (int l = 0; l < 6; ++l) {
      glm::vec3 old_c = sample(img, s, layout::kv_block_position(old_pos, l));
      glm::vec3 held_c = sample(img, s, layout::kv_block_position(start + 1, l));
      EXPECT_GT(luma(held_c), 0.15f) << "layer " << l << ": a held block is not drawn";
      if (l == 5) {
        EXPECT_GT(luma(old_c), 0.15f) << "the global layer's old block is not drawn";
      } else {
        EXPECT_TRUE(near_background(old_c, s))
            << "layer " << l << ": an evicted block is still drawn (" << old_c.r << "," << old_c.g
            << "," << old_c.b << ")";
      }
      // The block the step evicted: there as the step begins, gone once it has played.
      glm::vec3 leaving_c = sample(img, s, layout::kv_block_position(leaving_pos, l));
      if (l == 5 || since == 0.0)
        EXPECT_GT(luma(leaving_c), 0.15f) << "layer " << l << " at t=" << since;
      else
        EXPECT_TRUE(near_background(leaving_c, s)) << "layer " << l << " still leaving";
    }
    // The boundary plate is drawn between the last evicted and the first held position.
    glm::vec3 plate =
        sample(img, s, {float(start) - 0.5f, layout::kv_block_position(0, 2).y, 0.3f});
    EXPECT_GT(plate.r, 0.6f);
    EXPECT_GT(plate.r, plate.b + 0.3f) << "no amber window boundary";
  }
}

// ---------------------------------------------------------------- KV heads

TEST(KvScene, EachBlockSplitsIntoTheKvHeadsAndAQueryHeadLightsExactlyItsOwn) {
  SyntheticRun r;
  r.n_tokens = 24;
  r.n_layer = 3;
  r.n_head = 9;  // SmolLM2's shape: 9 query heads share 3 KV heads
  Timeline tl = synthetic_run(r);
  ViewOptions v = view_with(3);
  // Mean over heads: nothing lit, every position has 3 slices per layer.
  render::Scene mean = build_scene(tl, v, settled());
  EXPECT_EQ(mean.kv_blocks.size(), size_t(24 * 3 * 3));
  for (const auto& k : mean.kv_blocks) EXPECT_EQ(k.highlight, 0.0f);
  EXPECT_LT(mean.kv_block_size.x, layout::kKvWidth / 3.0f);
  // x order (position, KV head, layer) so the renderer can cull by x.
  for (size_t i = 1; i < mean.kv_blocks.size(); ++i)
    ASSERT_LE(mean.kv_blocks[i - 1].position.x, mean.kv_blocks[i].position.x);

  v.aggregation = HeadAggregation::Single;
  for (int h = 0; h < 9; ++h) {
    v.head = h;
    EXPECT_EQ(kv_head_of(h, 9, 3), h / 3);
    render::Scene s = build_scene(tl, v, settled());
    std::set<int> lit_heads;
    int lit = 0;
    for (const auto& k : s.kv_blocks) {
      BlockAt b = block_at(k, 3);
      if (k.highlight > 0.0f) {
        lit_heads.insert(b.head);
        ++lit;
      }
    }
    EXPECT_EQ(lit_heads, std::set<int>{h / 3}) << "query head " << h;
    EXPECT_EQ(lit, 24 * 3) << "query head " << h << ": every layer's slice of its KV head";
  }
  // Multi-query (one KV head): every query head reads it.
  EXPECT_EQ(kv_head_of(3, 4, 1), 0);
  EXPECT_EQ(kv_head_of(9, 9, 3), -1);
}

TEST(KvScenePixels, TheLitKvHeadIsBrighterThanTheOthers) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  SyntheticRun run;
  run.n_tokens = 24;
  run.n_layer = 3;
  run.n_head = 9;
  Timeline tl = synthetic_run(run);
  ViewOptions v = view_with(3);
  v.aggregation = HeadAggregation::Single;
  for (int h : {0, 4, 8}) {
    v.head = h;
    render::Scene s = build_scene(tl, v, settled());
    s.grid.visible = false;
    const int pos = 10;
    s.camera = front_camera(float(pos), layout::kv_block_position(0, 1).y, 2.5f);
    Image img = kvscope::test::render_image(*r, s, 480, 360);
    float b[3];
    for (int g = 0; g < 3; ++g)
      b[g] = luma(sample(img, s, layout::kv_head_position(pos, 1, g, 3) + glm::vec3(0, 0, 0.3f)));
    for (int g = 0; g < 3; ++g) {
      if (g == h / 3) continue;
      EXPECT_GT(b[h / 3], 1.8f * b[g])
          << "query head " << h << ": KV head " << h / 3 << " is not lit next to KV head " << g;
    }
  }
}

// ---------------------------------------------------------------- quantized caches

TEST(KvScene, QuantizedTypesHatchTheBlocks) {
  EXPECT_EQ(kv_hatch(KvDtype::F16), 0.0f);
  EXPECT_EQ(kv_hatch(KvDtype::F32), 0.0f);
  EXPECT_GT(kv_hatch(KvDtype::Q8_0), kv_hatch(KvDtype::Q4_0));  // more bits, finer stripes
  EXPECT_GT(kv_hatch(KvDtype::Q4_0), 0.0f);
  Timeline tl = synthetic_run(gemma_like(20));
  ViewOptions v = view_with(1);
  v.kv_types = {KvDtype::Q4_0, KvDtype::F16};
  render::Scene s = build_scene(tl, v, settled());
  int hatched = 0;
  for (const auto& k : s.kv_blocks) {
    EXPECT_EQ(k.hatch_v, 0.0f);
    hatched += k.hatch_k == kv_hatch(KvDtype::Q4_0);
  }
  EXPECT_GE(hatched, int(s.kv_blocks.size()) - 6);  // all but the newest token's placeholders
}

TEST(KvScenePixels, AHatchedBlockShowsStripesAPlainOneDoesNot) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_run(gemma_like(20));
  auto dark_runs = [&](KvTypes types) {
    ViewOptions v = view_with(1);
    v.kv_types = types;
    render::Scene s = build_scene(tl, v, settled());
    s.grid.visible = false;
    const glm::vec3 c = layout::kv_block_position(10, 5);  // the global layer
    s.camera = front_camera(c.x, c.y, 1.2f);
    Image img = kvscope::test::render_image(*r, s, 480, 360);
    // Along the middle row of the block's front face, inside its edges.
    glm::vec2 a = kvscope::test::to_screen(s, c + glm::vec3(-0.24f, 0, 0.3f), 480, 360);
    glm::vec2 b = kvscope::test::to_screen(s, c + glm::vec3(0.24f, 0, 0.3f), 480, 360);
    const int y = int(a.y);
    float lo = 1e9f, hi = -1e9f;
    for (int x = int(a.x); x <= int(b.x); ++x) {
      lo = std::min(lo, luma(img.at(x, y)));
      hi = std::max(hi, luma(img.at(x, y)));
    }
    int runs = 0;
    bool in = false;
    for (int x = int(a.x); x <= int(b.x); ++x) {
      bool dark = luma(img.at(x, y)) < 0.5f * (lo + hi) && hi - lo > 0.05f;
      runs += dark && !in;
      in = dark;
    }
    return runs;
  };
  EXPECT_EQ(dark_runs({KvDtype::F16, KvDtype::F16}), 0);
  EXPECT_GE(dark_runs({KvDtype::Q4_0, KvDtype::Q4_0}), 2);
}

// ---------------------------------------------------------------- view polish

TEST(ViewPolish, OverviewMarksTheStrongestTargetsOfALongRunNextToADominantSink) {
  const int n = 2000, cols = 1200;
  std::vector<float> w(n, 1e-4f);
  w[0] = 0.7f;
  for (int j : {150, 900, 1500}) w[size_t(j)] = 0.02f;
  w[1990] = 0.05f;
  OverviewMarks m = overview_marks(w, n + 1, cols);
  EXPECT_EQ(m.sink_column, overview_column(0, n + 1, cols));
  ASSERT_GE(m.top.size(), 4u);
  EXPECT_EQ(m.top[0], 1990);
  EXPECT_EQ(std::set<int>(m.top.begin() + 1, m.top.begin() + 4), (std::set<int>{150, 900, 1500}));
  // The strongest target is full height, the next ones well up, the floor flat.
  EXPECT_FLOAT_EQ(m.height[size_t(overview_column(1990, n + 1, cols))], 1.0f);
  for (int j : {150, 900, 1500}) EXPECT_GT(m.height[size_t(overview_column(j, n + 1, cols))], 0.7f);
  EXPECT_EQ(m.height[size_t(overview_column(600, n + 1, cols))], 0.0f);
}

TEST(ViewPolish, TheNoGpuNoticeIsOnePlainSentence) {
  for (const char* err :
       {"cuda: no usable GPU: no CUDA-capable device; use the CPU backend",
        "cuda: no usable GPU: no NVIDIA driver (or one too old for this CUDA runtime) "
        "(cudaGetDeviceCount: cudaErrorInsufficientDriver); use the CPU backend"}) {
    std::string n = gpu_fallback_notice(err);
    std::string lower = n;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    size_t first = lower.find("no usable gpu");
    EXPECT_EQ(first, 0u) << n;
    EXPECT_EQ(lower.find("no usable gpu", first + 1), std::string::npos) << n;
    EXPECT_EQ(lower.find("cuda:"), std::string::npos) << n;
    EXPECT_EQ(std::count(n.begin(), n.end(), '.'), 1) << n;
    EXPECT_EQ(n.back(), '.');
  }
  EXPECT_EQ(gpu_fallback_notice("cuda: no usable GPU: no CUDA-capable device; use the CPU backend"),
            "No usable GPU (no CUDA-capable device); running on the CPU backend.");
}

TEST(ViewPolish, TopViewLabelsOfTheMostAttendedTokensAreFlatLegibleAndApart) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  SyntheticRun run;
  run.n_tokens = 2000;
  run.n_layer = 2;
  run.n_head = 2;
  run.spikes = {120, 480, 800, 1111, 1400, 1700, 1850};
  Timeline tl = synthetic_run(run);
  UiState ui;
  ui.prompts = {{"synthetic", {"synthetic", false}}};
  ui.facts.n_layer = 2;
  ui.facts.n_head = 2;
  ui.view.layer = 1;
  AppShot shot;
  shot.width = 1280;
  shot.height = 720;
  shot.preset = render::CameraPreset::Top;
  auto res = capture_app(*r, ui, tl, shot);
  ASSERT_TRUE(res.ok()) << res.error().message;
  const AppShotResult& cap = res.value();
  const render::Scene& s = cap.scene;
  Image img{1280, 720, cap.rgba};
  if (const char* dir = std::getenv("KVSCOPE_TEST_DUMP"))
    (void)render::write_png(std::string(dir) + "/kv_view_top_labels.png", 1280, 720, cap.rgba);
  const render::Viewport& vp = cap.view;
  auto p0 = render::project_to_viewport(s.camera, s.tokens.front().position, vp);
  auto p1 = render::project_to_viewport(s.camera, s.tokens.back().position, vp);
  ASSERT_TRUE(p0 && p1);
  const float ppt = (p1->x - p0->x) / float(s.tokens.size() - 1);
  const float line_px = flat_label_px(s, ppt);
  EXPECT_GE(line_px, kReadableLabelPx);

  struct Box {
    float x0, y0, x1, y1;
    int pos;
  };
  std::vector<Box> boxes;
  std::vector<render::GlyphQuad> quads;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const render::TokenInstance& t = s.tokens[i];
    if (!t.label_flat) continue;
    glm::vec3 anchor = t.position + glm::vec3(0, 0.5f * s.token_size.y, 0.5f * s.token_size.z);
    auto a = render::project_to_viewport(s.camera, anchor, vp);
    ASSERT_TRUE(a);
    quads.clear();
    float wu = r->atlas().layout(t.label, &quads);  // the real glyph advances
    float top = a->y + (render::kFlatLabelGap + render::kFlatLabelLane * t.label_lane) * line_px;
    boxes.push_back(
        {a->x - 0.5f * wu * line_px, top, a->x + 0.5f * wu * line_px, top + line_px, int(i)});
  }
  // The spikes (and the newest token) are read flat.
  std::set<int> flat;
  for (const Box& b : boxes) flat.insert(b.pos);
  EXPECT_GE(boxes.size(), 7u);
  for (int j : run.spikes) EXPECT_TRUE(flat.count(j)) << "position " << j << " is not flat";
  EXPECT_TRUE(flat.count(1999)) << "the newest token is not flat";
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box& a = boxes[i];
    EXPECT_GE(a.x0, float(vp.x)) << a.pos;
    EXPECT_LE(a.x1, float(vp.x + vp.width)) << a.pos;
    EXPECT_LE(a.y1, float(vp.y + vp.height)) << a.pos;
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      const Box& b = boxes[j];
      bool overlap = a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
      EXPECT_FALSE(overlap) << "labels of " << a.pos << " and " << b.pos << " overlap";
    }
    // Text is drawn in the box: bright pixels on the dark background.
    int bright = 0;
    for (int y = int(a.y0); y < int(a.y1); ++y)
      for (int x = int(a.x0); x < int(a.x1); ++x)
        bright += img.inside(x, y) && luma(img.at(x, y)) > 0.35f;
    EXPECT_GE(bright, 10) << "no text where the label of " << a.pos << " goes: " << a.x0 << ","
                          << a.y0 << " " << a.x1 << "," << a.y1;
  }
}

// --look-at: a screenshot can show an old part of a long run (where a windowed layer's
// blocks are gone): the camera slides there, the newest token leaves the picture.
TEST(ViewPolish, LookAtBringsAnOldPositionToTheMiddleOfTheView) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_run(gemma_like(400));
  UiState ui;
  ui.prompts = {{"synthetic", {"synthetic", false}}};
  ui.facts.n_layer = 6;
  ui.facts.n_head = 4;
  ui.view.layer = 0;
  AppShot shot;
  shot.width = 640;
  shot.height = 400;
  shot.panels = false;
  shot.look_at_pos = 20;
  auto res = capture_app(*r, ui, tl, shot);
  ASSERT_TRUE(res.ok()) << res.error().message;
  const render::Scene& s = res.value().scene;
  const render::Viewport& vp = res.value().view;
  auto at = render::project_to_viewport(s.camera, s.tokens[20].position, vp);
  ASSERT_TRUE(at);
  EXPECT_NEAR(at->x, vp.x + 0.5f * vp.width, 0.1f * vp.width);
  auto newest = render::project_to_viewport(s.camera, s.tokens.back().position, vp);
  EXPECT_TRUE(!newest || newest->x > float(vp.x + vp.width)) << "the newest token is in view";
}
