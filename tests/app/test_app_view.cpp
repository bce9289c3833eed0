// test_app_view.cpp — whole-app frames (panels and 3D view, offscreen, as a user sees
// them): at 1024x640, 1280x720 and 1920x1080 every camera preset shows the write head
// and the newest token inside the rectangle the panels leave free, located by their
// pixels; TOP at 300 tokens has every beam's end inside that rectangle, and lit; the head
// keeps its size on screen in every preset over 160 tokens; scrubbing
// the history rebuilds the 3D view for the step looked at; a new run is framed at once after
// the person zoomed into the old one.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "app/core/engine_setup.h"
#include "app/scene/scene_view.h"
#include "app/ui/app_capture.h"
#include "gl_test_context.h"
#include "pixel_utils.h"
#include "render/camera.h"
#include "render/offscreen.h"
#include "render/synthetic_scene.h"
#include "synthetic_run.h"
#include "tests/render/expected_layout.h"

// Expected positions come from the documented geometry, not render::layout.
namespace expected_layout = kvscope::test::expected_layout;

using namespace kvscope;
using namespace kvscope::app;
using kvscope::test::Image;

namespace {

const PromptSpec kPrompt{"Once upon a time, in a kingdom far away, there lived", false};

Image image_of(const AppShotResult& r, int w, int h) {
  // KVSCOPE_TEST_DUMP=DIR saves every frame for a human to look at.
  if (const char* dir = std::getenv("KVSCOPE_TEST_DUMP")) {
    static int counter = 0;
    std::string path = std::string(dir) + "/app_view_" + std::to_string(counter++) + ".png";
    (void)render::write_png(path, w, h, r.rgba);
  }
  return Image{w, h, r.rgba};
}

bool inside(const render::Viewport& v, glm::vec2 p, float margin) {
  return p.x >= v.x + margin && p.y >= v.y + margin && p.x < v.x + v.width - margin &&
         p.y < v.y + v.height - margin;
}

// The head's glow: bright, warm, yellow-white (the halo over the sphere).
bool is_head_glow(glm::vec3 c) {
  return c.r > 0.8f && c.g > 0.62f && c.r > c.b + 0.15f;
}
// A generated token's block: the orange of palette::kGeneratedToken, lit or shaded.
bool is_generated_orange(glm::vec3 c) {
  return c.r > 0.35f && c.r > c.g + 0.15f && c.r > c.b + 0.18f;
}

// Pixels within `radius` of p that satisfy pred.
template <class Pred>
int count_near(const Image& img, glm::vec2 p, int radius, Pred pred) {
  int n = 0;
  for (int dy = -radius; dy <= radius; ++dy)
    for (int dx = -radius; dx <= radius; ++dx) {
      int x = int(p.x) + dx, y = int(p.y) + dy;
      if (img.inside(x, y) && pred(img.at(x, y))) ++n;
    }
  return n;
}

// World point -> framebuffer pixel: the 3D view's own projection (tests/render/pixel_utils.h,
// not the renderer's), offset by where the view sits in the window.
glm::vec2 project(const AppShotResult& r, glm::vec3 world) {
  return test::to_screen(r.scene.camera, world, r.view.width, r.view.height) +
         glm::vec2(float(r.view.x), float(r.view.y));
}

UiState ui_for(const ModelFacts& facts) {
  UiState ui;
  ui.prompts = {{"narrative", kPrompt}};
  ui.facts = facts;
  ui.view.layer = facts.n_layer / 2;
  return ui;
}

// A timeline of `n_tokens` tokens (8 prompt) from hand-made traces whose attention gives
// every earlier position a visible weight: a sink at 0, a local decay, a floor.
Timeline synthetic_timeline(int n_tokens) {
  const int L = 2, H = 2, P = 8;
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  reset.prompt_text = "synthetic";
  tl.apply(reset);
  for (int step = 1; P + step - 1 < n_tokens; ++step) {
    auto t = std::make_shared<StepTrace>();
    t->step = step;
    t->pos = P + step - 1;
    t->token_id = 100 + step;
    t->text = " w" + std::to_string(t->pos);
    if (step == 1)
      for (int i = 0; i < P; ++i) t->prompt.push_back({i, " p" + std::to_string(i)});
    t->n_layer = L;
    t->n_head = H;
    t->n_attn = t->pos;
    t->attention.resize(size_t(L) * H * t->n_attn);
    for (int lh = 0; lh < L * H; ++lh) {
      float sum = 0;
      float* a = &t->attention[size_t(lh) * t->n_attn];
      for (int j = 0; j < t->n_attn; ++j) {
        a[j] = (j == 0 ? 20.0f : 0.0f) + 1.0f + 5.0f * std::exp(-float(t->n_attn - 1 - j) / 10.0f);
        sum += a[j];
      }
      for (int j = 0; j < t->n_attn; ++j) a[j] /= sum;
    }
    t->kv_first_pos = step == 1 ? 0 : t->pos - 1;
    t->kv_written = step == 1 ? P : 1;
    for (int l = 0; l < L; ++l)
      for (int i = 0; i < t->kv_written; ++i) {
        t->k_norm.push_back(1.0f + 0.1f * float((t->kv_first_pos + i + l) % 7));
        t->v_norm.push_back(1.0f);
      }
    t->seq_len = t->pos + 1;
    t->tokens_processed = step == 1 ? P : 1;
    Event e{Event::Kind::Step, 1};
    e.trace = t;
    tl.apply(e);
  }
  return tl;
}

}  // namespace

class AppView : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model not found";
  }
};

TEST_F(AppView, EveryPresetShowsTheHeadAndNewestTokenInTheFreeRectangle) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  auto eng = open_engine(eo);
  ASSERT_TRUE(eng.ok()) << eng.error().message;
  Timeline tl;
  ASSERT_TRUE(run_steps(*eng.value().session, kPrompt, 10, &tl).ok());
  const ModelFacts facts = model_facts(eng.value());
  const int newest = int(tl.tokens().size()) - 1;
  ASSERT_FALSE(tl.tokens()[size_t(newest)].prompt);

  for (auto [W, H] : {std::pair{1024, 640}, std::pair{1280, 720}, std::pair{1920, 1080}}) {
    for (render::CameraPreset p : render::kAllCameraPresets) {
      std::string what =
          std::to_string(W) + "x" + std::to_string(H) + " " + render::camera_preset_name(p);
      UiState ui = ui_for(facts);
      AppShot shot;
      shot.width = W;
      shot.height = H;
      shot.preset = p;
      auto res = capture_app(*r, ui, tl, shot);
      ASSERT_TRUE(res.ok()) << res.error().message;
      const AppShotResult& cap = res.value();
      Image img = image_of(cap, W, H);
      // The free rectangle is the layout's view, and it is what the 3D view filled.
      EXPECT_EQ(cap.view.x, int(std::lround(cap.layout.view.x))) << what;
      EXPECT_GT(cap.view.width, W / 2 - 1) << what;

      glm::vec2 head = project(cap, cap.scene.head.position);
      EXPECT_TRUE(inside(cap.view, head, 4.0f))
          << what << ": head at " << head.x << "," << head.y << " outside the view " << cap.view.x
          << "," << cap.view.y << " " << cap.view.width << "x" << cap.view.height;
      EXPECT_GE(count_near(img, head, 3, is_head_glow), 6) << what << ": no head glow at its place";

      glm::vec2 tok = project(cap, expected_layout::token_position(newest));
      EXPECT_TRUE(inside(cap.view, tok, 2.0f)) << what << ": newest token outside the view";
      EXPECT_GE(count_near(img, tok, 3, is_generated_orange), 4)
          << what << ": the newest token's colour is not where it projects";
    }
  }
}

TEST(AppViewTop, ThreeHundredTokensEveryBeamEndsInsideTheFrameAndIsLit) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_timeline(300);
  ASSERT_EQ(tl.tokens().size(), 300u);
  ModelFacts facts;
  facts.n_layer = 2;
  facts.n_head = 2;
  for (auto [W, H] : {std::pair{1024, 640}, std::pair{1280, 720}, std::pair{1920, 1080}}) {
    std::string what = std::to_string(W) + "x" + std::to_string(H);
    UiState ui = ui_for(facts);
    AppShot shot;
    shot.width = W;
    shot.height = H;
    shot.preset = render::CameraPreset::Top;
    auto res = capture_app(*r, ui, tl, shot);
    ASSERT_TRUE(res.ok()) << res.error().message;
    const AppShotResult& cap = res.value();
    Image img = image_of(cap, W, H);
    const render::Scene& s = cap.scene;
    ASSERT_EQ(s.beams.size(), 299u) << what;  // the newest query attends every earlier slot
    const glm::vec3 bg = s.background;
    int lit = 0;
    for (size_t i = 0; i < s.beams.size(); ++i) {
      const render::Beam& b = s.beams[i];
      ASSERT_GT(b.weight, 0.004f) << "beam " << i << " would not be drawn";
      glm::vec2 end = project(cap, b.to);
      glm::vec2 apex =
          project(cap, render::beam_apex(b.from + s.anim.beam_shift, b.to, s.anim.beam_arc));
      EXPECT_TRUE(inside(cap.view, end, 1.0f)) << what << ": beam " << i << " ends outside";
      EXPECT_TRUE(inside(cap.view, apex, 1.0f)) << what << ": beam " << i << " arcs outside";
      // Something brighter than the background where the beam lands.
      lit += count_near(img, end, 2, [&](glm::vec3 c) {
               return std::max({c.r - bg.r, c.g - bg.g, c.b - bg.b}) > 0.08f;
             }) > 0;
    }
    EXPECT_EQ(lit, 299) << what;
    // The head too.
    EXPECT_TRUE(inside(cap.view, project(cap, s.head.position), 2.0f)) << what;
  }
}

// The write head is a marker of constant size: TOP frames a long sequence from far away,
// and the head must still be a bright spot a person finds at a glance, in every preset.
TEST(AppViewHead, TheHeadKeepsItsScreenSizeInEveryPresetOverALongSequence) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_timeline(160);
  ModelFacts facts;
  facts.n_layer = 2;
  facts.n_head = 2;
  for (auto [W, H] : {std::pair{1024, 640}, std::pair{1280, 720}, std::pair{1920, 1080}}) {
    for (render::CameraPreset p : render::kAllCameraPresets) {
      std::string what =
          std::to_string(W) + "x" + std::to_string(H) + " " + render::camera_preset_name(p);
      UiState ui = ui_for(facts);
      AppShot shot;
      shot.width = W;
      shot.height = H;
      shot.preset = p;
      auto res = capture_app(*r, ui, tl, shot);
      ASSERT_TRUE(res.ok()) << res.error().message;
      const AppShotResult& cap = res.value();
      Image img = image_of(cap, W, H);
      const render::Scene& s = cap.scene;
      // Its drawn radius, measured on screen across the view direction.
      const glm::vec3 eye = s.camera.eye, fwd = glm::normalize(s.camera.target - eye);
      const glm::vec3 across = glm::normalize(glm::cross(fwd, s.camera.up));
      const float radius = render::head_drawn_radius(s, float(cap.view.height));
      const glm::vec2 c = project(cap, s.head.position);
      const float px = glm::length(project(cap, s.head.position + across * radius) - c);
      EXPECT_GE(px, kHeadMinPx - 0.5f) << what;
      // And on screen: a disc of head glow at least that wide where it projects.
      const int lit = count_near(img, c, int(kHeadMinPx), is_head_glow);
      EXPECT_GE(lit, int(2.0f * kHeadMinPx * kHeadMinPx))
          << what << ": the head covers " << lit << " bright pixels";
    }
  }
}

TEST(AppViewNotices, ANoticeDrawsInsideTheViewNeverOverThePanels) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_timeline(40);
  ModelFacts facts;
  facts.n_layer = 2;
  facts.n_head = 2;
  const int W = 1280, H = 720;
  AppShot shot;
  shot.width = W;
  shot.height = H;
  const std::string text = "no usable GPU (no CUDA device found); using the CPU backend";
  UiState plain = ui_for(facts);  // the same notice, dismissed: in the Messages list only
  add_notice(plain, text);
  plain.notices.clear();
  auto a = capture_app(*r, plain, tl, shot);
  UiState noticed = ui_for(facts);
  add_notice(noticed, text);
  auto b = capture_app(*r, noticed, tl, shot);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(noticed.notices.size(), 1u);  // still there: it fades only after kNoticeSeconds
  const render::Viewport v = b.value().view;
  int inside_changed = 0, outside_changed = 0;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      size_t i = (size_t(y) * W + x) * 4;
      bool differs = std::abs(int(a.value().rgba[i]) - int(b.value().rgba[i])) > 8 ||
                     std::abs(int(a.value().rgba[i + 1]) - int(b.value().rgba[i + 1])) > 8;
      bool in_view = x >= v.x && x < v.x + v.width && y >= v.y && y < v.y + v.height;
      (in_view ? inside_changed : outside_changed) += differs;
    }
  EXPECT_GT(inside_changed, 2000);  // the notice is drawn, in the view
  EXPECT_EQ(outside_changed, 0);    // and nothing of the panels changed
}

TEST(AppViewExport, ExportPngSavesTheViewAsShownUnderAFreshName) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  Timeline tl = synthetic_timeline(60);
  ModelFacts facts;
  facts.n_layer = 2;
  facts.n_head = 2;
  UiState ui = ui_for(facts);
  AppShot shot;
  shot.preset = render::CameraPreset::Follow;
  auto cap = capture_app(*r, ui, tl, shot);
  ASSERT_TRUE(cap.ok());
  const render::Viewport v = cap.value().view;
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kvscope_export_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto first = export_view_png(*r, cap.value().scene, v.width, v.height, dir.string());
  auto second = export_view_png(*r, cap.value().scene, v.width, v.height, dir.string());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first.value(), second.value());  // never overwrites an earlier export
  EXPECT_TRUE(fs::path(first.value()).is_absolute());
  // The file holds exactly the view's pixels: the same bytes as those pixels written as PNG.
  auto px = render_offscreen(*r, cap.value().scene, v.width, v.height);
  ASSERT_TRUE(px.ok());
  fs::path ref = dir / "reference.png";
  ASSERT_TRUE(render::write_png(ref.string(), v.width, v.height, px.value()).ok());
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(bytes(first.value()), bytes(ref));
  EXPECT_GT(fs::file_size(first.value()), 1000u);
  // The view's pixels show the scene (the head's glow where it projects).
  Image img{v.width, v.height, px.value()};
  auto head = render::project_to_screen(cap.value().scene.camera, cap.value().scene.head.position,
                                        v.width, v.height);
  ASSERT_TRUE(head.has_value());
  EXPECT_GE(count_near(img, *head, 3, is_head_glow), 6);
  fs::remove_all(dir);
}

// Scrubbing the history in the window: the 3D view is rebuilt for the step looked at (its
// tokens, the head after its newest position), the scene a fresh view of that step builds;
// back to live, the newest step's again.
TEST(AppViewHistory, ScrubbingRebuildsTheSceneForTheViewedStep) {
  Timeline tl = kvscope::test::synthetic_run(kvscope::test::SyntheticRun{});
  ViewFrame f;
  f.timeline = &tl;
  f.rect = UiRect{0, 0, 800, 500};
  SceneView view;
  view.update(f, ViewInput{});
  const size_t n_live = view.scene().tokens.size();
  ASSERT_EQ(int(n_live), tl.viewed_seq_len());
  tl.scrub_to(10);
  ASSERT_FALSE(tl.live());
  view.update(f, ViewInput{});
  SceneView fresh;
  fresh.update(f, ViewInput{});
  EXPECT_EQ(int(view.scene().tokens.size()), tl.viewed_seq_len());
  EXPECT_LT(view.scene().tokens.size(), n_live);
  EXPECT_EQ(view.scene().tokens.size(), fresh.scene().tokens.size());
  EXPECT_EQ(view.scene().head.position, fresh.scene().head.position);
  EXPECT_EQ(view.scene().beams.size(), fresh.scene().beams.size());
  tl.follow_live();
  view.update(f, ViewInput{});
  EXPECT_EQ(view.scene().tokens.size(), n_live);
}

// After a new run starts (Reset, or a new KV type applied, which opens the model again) the
// view frames the new sequence at once, even when the person had zoomed far into the old
// run's end with a SIDE camera: the head waiting at position 0 is on screen before Play.
TEST(AppViewReset, ANewRunIsFramedAtOnceAfterTheViewWasZoomedIn) {
  Timeline tl = synthetic_timeline(200);
  ViewFrame f;
  f.timeline = &tl;
  f.rect = UiRect{0, 0, 800, 500};
  f.preset = render::CameraPreset::Side;
  f.dt = 1.0f / 60.0f;
  const render::Viewport vp{0, 0, 800, 500};
  auto on_screen = [&](const SceneView& v, glm::vec3 p) {
    auto q = render::project_to_viewport(v.scene().camera, p, vp);
    return q && inside(vp, *q, 2.0f);
  };
  SceneView view;
  view.update(f, ViewInput{});
  ViewInput zoom;
  zoom.hover = true;
  zoom.mouse_x = 700;
  zoom.mouse_y = 250;
  zoom.wheel = 2;
  for (int i = 0; i < 30; ++i) view.update(f, zoom);
  ASSERT_FALSE(on_screen(view, expected_layout::token_position(0)))
      << "the zoom did not leave the start of the sequence";

  Event reset{Event::Kind::Reset, tl.run() + 1};
  reset.prompt_text = "synthetic";
  ASSERT_TRUE(tl.apply(reset));
  view.update(f, ViewInput{});  // the first frame after the Reset event
  EXPECT_TRUE(on_screen(view, view.scene().head.position)) << "the head is out of view";
  EXPECT_TRUE(on_screen(view, expected_layout::token_position(0)));
  EXPECT_TRUE(view.scene().grid.visible);
}
