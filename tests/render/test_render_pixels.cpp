// test_render_pixels.cpp — renders synthetic scenes offscreen and checks what a viewer
// would see: one block per token, one KV block per layer, beams as bright as their
// weights, red recompute blocks only when asked, readable labels, each camera preset showing
// the head, the newest token and its KV stack where its view puts them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <glm/trigonometric.hpp>

#include "gl_test_context.h"
#include "pixel_utils.h"
#include "render/offscreen.h"
#include "render/synthetic_scene.h"
#include "tests/render/expected_layout.h"

// Expected positions come from the documented geometry, not render::layout.
namespace expected_layout = kvscope::test::expected_layout;

namespace render = kvscope::render;
using namespace kvscope;
using namespace kvscope::test;
using render::CameraPreset;

namespace {

constexpr int kW = 800, kH = 450;

// Anything visibly different from the clear color.
bool is_drawn(glm::vec3 c) {
  glm::vec3 bg = render::Scene{}.background;
  return std::max({std::abs(c.r - bg.r), std::abs(c.g - bg.g), std::abs(c.b - bg.b)}) > 0.04f;
}
bool is_red(glm::vec3 c) {
  return c.r > 0.55f && c.g < 0.22f && c.b < 0.22f;
}
float luminance(glm::vec3 c) {
  return 0.2126f * c.r + 0.7152f * c.g + 0.0722f * c.b;
}

render::Scene bare_scene(int tokens, int layers) {
  render::SyntheticSpec spec;
  spec.n_tokens = tokens;
  spec.n_prompt = 0;
  spec.n_layers = layers;
  spec.labels = false;
  render::Scene s = render::make_synthetic_scene(spec);
  s.beams.clear();
  s.head.visible = false;
  s.grid.visible = false;
  return s;
}

int count_red(const Image& img) {
  int n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) n += is_red(img.at(x, y));
  return n;
}

}  // namespace

TEST(RenderPixels, OneBlockPerTokenSideAndTop) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  for (int n : {5, 12, 23}) {
    for (CameraPreset p : {CameraPreset::Side, CameraPreset::Top}) {
      render::Scene s = bare_scene(n, 0);
      frame_scene(&s, p, kW, kH);
      Image img = render_image(*r, s, kW, kH);
      // The face turned to the camera has one shade; count its runs along the row
      // through the first token's center (perspective shows side faces in between).
      glm::vec2 c0 = to_screen(s, expected_layout::token_position(0), kW, kH);
      if (p == CameraPreset::Top)
        c0 = to_screen(s, expected_layout::token_position(0) + glm::vec3(0, 0.4f, 0), kW, kH);
      glm::vec3 face = img.at(int(c0.x), int(c0.y));
      EXPECT_TRUE(is_drawn(face));
      auto same_face = [&](glm::vec3 c) {
        return std::max({std::abs(c.r - face.r), std::abs(c.g - face.g), std::abs(c.b - face.b)}) <
               0.05f;
      };
      EXPECT_EQ(count_runs(img, false, int(c0.y), same_face), n)
          << n << " tokens, preset " << render::camera_preset_name(p);
      EXPECT_EQ(r->last_stats().tokens, size_t(n));
    }
  }
}

TEST(RenderPixels, OneKvBlockPerLayer) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  for (int layers : {6, 30}) {
    render::Scene s = bare_scene(3, layers);
    s.tokens.clear();  // only the stacks
    // Face-on through a long lens (nearly orthographic) so the gaps between layers show.
    glm::vec3 mid = 0.5f * (expected_layout::kv_block_position(1, 0) +
                            expected_layout::kv_block_position(1, layers - 1));
    float height = layers * expected_layout::kKvPitch * 1.2f;
    s.camera.fov_y_deg = 3.0f;
    s.camera.target = mid;
    s.camera.eye = mid + glm::vec3(0.0f, 0.0f, height / std::tan(glm::radians(1.5f)) * 0.5f);
    s.camera.far_plane = 1000.0f;
    s.camera.near_plane = 1.0f;
    Image img = render_image(*r, s, kW, kH);
    int col = int(to_screen(s, mid, kW, kH).x);
    EXPECT_EQ(count_runs(img, true, col, is_drawn), layers) << layers << " layers";
    EXPECT_EQ(r->last_stats().kv_blocks, size_t(3 * layers));
  }
}

TEST(RenderPixels, BeamBrightnessFollowsWeights) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  const std::vector<float> weights = {0.15f, 0.9f, 0.05f, 0.5f, 0.3f, 0.7f};
  render::SyntheticSpec spec;
  spec.n_tokens = int(weights.size());
  spec.n_layers = 4;
  spec.weights = weights;
  spec.labels = false;
  render::Scene s = render::make_synthetic_scene(spec);
  s.tokens.clear();
  s.kv_blocks.clear();
  s.head.visible = false;
  s.grid.visible = false;
  frame_scene(&s, CameraPreset::Side, kW, kH);
  Image img = render_image(*r, s, kW, kH);

  // Sample each beam near its landing end, where beams do not overlap.
  std::vector<float> seen;
  for (size_t i = 0; i < weights.size(); ++i) {
    const render::Beam& b = s.beams[i];
    glm::vec3 p = b.to + glm::vec3(0.0f, 0.08f, 0.0f);
    glm::vec2 px = to_screen(s, p, kW, kH);
    float best = 0;
    for (int dy = -5; dy <= 5; ++dy)
      for (int dx = -5; dx <= 5; ++dx)
        if (img.inside(int(px.x) + dx, int(px.y) + dy))
          best = std::max(best, luminance(img.at(int(px.x) + dx, int(px.y) + dy)));
    seen.push_back(best);
  }
  for (size_t i = 0; i < weights.size(); ++i)
    for (size_t j = 0; j < weights.size(); ++j) {
      if (weights[i] > weights[j] + 0.1f) {
        EXPECT_GT(seen[i], seen[j]) << "beam " << i << " (w=" << weights[i] << ") vs beam " << j
                                    << " (w=" << weights[j] << ")";
      }
    }
  EXPECT_EQ(r->last_stats().beams, weights.size());
}

TEST(RenderPixels, RecomputeBlocksAreRedOnlyWhenFlagged) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::SyntheticSpec spec;
  spec.n_tokens = 10;
  spec.n_layers = 8;
  render::Scene cached = render::make_synthetic_scene(spec);
  spec.recompute = true;
  render::Scene recomputing = render::make_synthetic_scene(spec);
  frame_scene(&cached, CameraPreset::ThreeQuarter, kW, kH);
  frame_scene(&recomputing, CameraPreset::ThreeQuarter, kW, kH);
  int red_cached = count_red(render_image(*r, cached, kW, kH));
  int red_recompute = count_red(render_image(*r, recomputing, kW, kH));
  EXPECT_LT(red_cached, 50);
  EXPECT_GT(red_recompute, 5000);
}

TEST(RenderPixels, LabelsDrawTextAboveTokens) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::SyntheticSpec spec;
  spec.n_tokens = 8;
  spec.n_layers = 2;
  render::Scene with = render::make_synthetic_scene(spec);
  with.beams.clear();
  spec.labels = false;
  render::Scene without = render::make_synthetic_scene(spec);
  without.beams.clear();
  frame_scene(&with, CameraPreset::Side, kW, kH);
  frame_scene(&without, CameraPreset::Side, kW, kH);
  Image a = render_image(*r, with, kW, kH);
  EXPECT_GT(r->last_stats().glyphs, 20u);
  Image b = render_image(*r, without, kW, kH);
  // Light text pixels in the band above token 7 (" kingdom").
  glm::vec2 base =
      to_screen(with, expected_layout::token_position(7) + glm::vec3(0, 0.6f, 0), kW, kH);
  glm::vec2 top =
      to_screen(with, expected_layout::token_position(7) + glm::vec3(0, 3.0f, 0), kW, kH);
  int light_a = 0, light_b = 0;
  for (int y = int(top.y); y < int(base.y); ++y)
    for (int x = int(base.x) - 15; x <= int(base.x) + 15; ++x) {
      if (!a.inside(x, y)) continue;
      light_a += luminance(a.at(x, y)) > 0.7f;
      light_b += luminance(b.at(x, y)) > 0.7f;
    }
  EXPECT_GT(light_a, 40);
  EXPECT_EQ(light_b, 0);
}

// What each preset shows, read from its picture: where the documented layout puts a thing
// (expected_layout), carried through the preset's view and projection (to_screen, glm from
// the camera's own numbers), the picture has that thing's colour:
//   - every preset: the write head (a warm light) above the slot after the last token, the
//     newest token (a generated one: orange) on its face turned to the camera, and nothing
//     token-coloured in the slot the head writes next (but from FRONT, where the newest
//     token's side covers that slot);
//   - every preset but TOP (which looks down on the tokens' tops): the newest token's KV
//     stack under it, its first and last layer in the KV ramp's cool colours;
//   - TOP and SIDE frame the whole sequence: the first and the last prompt token (the dim
//     blue-grey) and the first generated one (orange) are in their slots; FOLLOW frames the
//     head and the last few tokens: the first is out of view.
// And no two presets give the same picture.
TEST(RenderPixels, CameraPresetsShowTheHeadTheNewestTokenAndItsStack) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  constexpr int kTokens = 30, kLayers = 12, kPromptTokens = 6;
  auto head_light = [](glm::vec3 c) { return c.r > 0.8f && c.g > 0.6f && c.b < c.g; };
  auto generated = [](glm::vec3 c) { return c.r > 0.45f && c.r > c.g + 0.2f && c.r > c.b + 0.25f; };
  auto prompt = [](glm::vec3 c) { return c.b > 0.2f && c.b > c.r + 0.05f && c.b >= c.g; };
  auto kv_ramp = [](glm::vec3 c) {
    return std::max(c.g, c.b) > 0.15f && c.r < std::max(c.g, c.b) - 0.08f;
  };
  std::vector<Image> images;
  for (CameraPreset p : render::kAllCameraPresets) {
    const char* name = render::camera_preset_name(p);
    SCOPED_TRACE(name);
    render::SyntheticSpec spec;
    spec.n_tokens = kTokens;
    spec.n_prompt = kPromptTokens;
    spec.n_layers = kLayers;
    render::Scene s = render::make_synthetic_scene(spec);
    frame_scene(&s, p, kW, kH);
    Image img = render_image(*r, s, kW, kH);
    EXPECT_LE(r->last_stats().draw_calls, 7);
    // The share of the pixels within (rx, ry) of where `world` lands that `pred` accepts,
    // and what that place looks like (for the message).
    struct Seen {
      float share = 0.0f;
      std::string where;
    };
    auto seen_at = [&](glm::vec3 world, int rx, int ry, auto pred) {
      const glm::vec2 c = to_screen(s, world, kW, kH);
      return Seen{share_around(img, c, rx, ry, pred), pixel_note(img, c)};
    };
    // The face a token turns to the camera: its top from above (the near half, where no beam
    // lands), else its front (+z).
    const bool top = p == CameraPreset::Top;
    auto token_face = [&](int pos) {
      return expected_layout::token_position(pos) +
             (top ? glm::vec3(0.0f, 0.4f, 0.2f) : glm::vec3(0.0f, 0.0f, 0.4f));
    };
    Seen head = seen_at(expected_layout::head_position(kTokens), 1, 1, head_light);
    EXPECT_GE(head.share, 0.6f) << "no write head above slot " << kTokens << head.where;
    Seen newest = seen_at(token_face(kTokens - 1), 2, 2, generated);
    EXPECT_GE(newest.share, 0.6f) << "the newest token is not in its slot" << newest.where;
    if (p != CameraPreset::Front) {  // FRONT looks back along the row: the newest token's
                                     // side hides the next slot
      Seen next = seen_at(token_face(kTokens), 2, 2, generated);
      EXPECT_LE(next.share, 0.2f) << "a token in the slot the head writes next" << next.where;
    }
    if (!top) {
      for (int layer : {0, kLayers - 1}) {
        Seen kv = seen_at(
            expected_layout::kv_block_position(kTokens - 1, layer) + glm::vec3(0.0f, 0.0f, 0.3f), 2,
            0, kv_ramp);
        EXPECT_GE(kv.share, 0.6f) << "no KV block of layer " << layer << " under the newest token"
                                  << kv.where;
      }
    }
    if (p == CameraPreset::Top || p == CameraPreset::Side) {
      // The whole sequence: the first token, and the last prompt token next to the first
      // generated one.
      for (int pos : {0, kPromptTokens - 1}) {
        Seen t = seen_at(token_face(pos), 2, 2, prompt);
        EXPECT_GE(t.share, 0.6f) << "prompt token " << pos << " is not in its slot" << t.where;
      }
      Seen g = seen_at(token_face(kPromptTokens), 2, 2, generated);
      EXPECT_GE(g.share, 0.6f) << "the first generated token is not in its slot" << g.where;
    }
    if (p == CameraPreset::Follow) {
      const glm::vec2 first = to_screen(s, expected_layout::token_position(0), kW, kH);
      EXPECT_FALSE(img.inside(int(first.x), int(first.y))) << "FOLLOW frames the first token too";
    }
    images.push_back(std::move(img));
  }
  for (size_t i = 0; i < images.size(); ++i)
    for (size_t j = i + 1; j < images.size(); ++j) {
      double diff = 0;
      for (size_t k = 0; k < images[i].rgba.size(); ++k)
        diff += std::abs(int(images[i].rgba[k]) - int(images[j].rgba[k]));
      diff /= double(images[i].rgba.size());
      EXPECT_GT(diff, 2.0) << render::camera_preset_name(render::kAllCameraPresets[i]) << " vs "
                           << render::camera_preset_name(render::kAllCameraPresets[j]);
    }
}

TEST(RenderPixels, WritesPng) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::Scene s = render::make_synthetic_scene({});
  frame_scene(&s, CameraPreset::ThreeQuarter, 320, 180);
  Image img = render_image(*r, s, 320, 180);
  auto path = std::filesystem::temp_directory_path() / "kvscope_render_test.png";
  Status res = render::write_png(path.string(), img.width, img.height, img.rgba);
  ASSERT_TRUE(res.ok()) << res.message();
  std::ifstream f(path, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  EXPECT_GT(std::filesystem::file_size(path), 1000u);
  std::filesystem::remove(path);
  EXPECT_FALSE(render::write_png("/nonexistent-dir/x.png", img.width, img.height, img.rgba).ok());
}

TEST(RenderPixels, BrokenShaderFolderIsAClearError) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto dir = std::filesystem::temp_directory_path() / "kvscope_bad_shaders";
  std::filesystem::create_directories(dir);
  for (const char* n : {"block", "head", "halo", "beam", "glyph", "grid"}) {
    std::ofstream(dir / (std::string(n) + ".vert"))
        << "#version 330 core\nvoid main(){gl_Position=vec4(0);}\n";
    std::ofstream(dir / (std::string(n) + ".frag"))
        << "#version 330 core\nout vec4 c; void main(){ c = oops; }\n";
  }
  render::RendererOptions opts;
  opts.shader_dir = dir.string();
  auto r = render::Renderer::create(opts);
  ASSERT_FALSE(r.ok());
  const std::string& why = r.error().message;
  EXPECT_NE(why.find("fragment"), std::string::npos) << why;
  EXPECT_NE(why.find("block.frag"), std::string::npos) << why;
  std::filesystem::remove_all(dir);
}

// Animation is uniforms: a scene with an unchanged revision re-uploads nothing, yet a
// flash set in SceneAnim still turns the flagged blocks red.
TEST(RenderPixels, SameRevisionUploadsNothingAndAnimationStillShows) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::Scene s = bare_scene(10, 8);
  for (auto& k : s.kv_blocks) {
    k.recompute = 0.0f;
    k.flash_recompute = 1.0f;  // red only while SceneAnim::flash is up
  }
  s.revision = render::next_scene_revision();
  frame_scene(&s, CameraPreset::ThreeQuarter, kW, kH);
  s.anim.flash = 0.0f;
  int red_calm = count_red(render_image(*r, s, kW, kH));
  EXPECT_GT(r->last_stats().uploaded_bytes, 0u);
  EXPECT_FALSE(r->last_stats().reused);
  s.anim.flash = 1.0f;
  int red_flash = count_red(render_image(*r, s, kW, kH));
  EXPECT_TRUE(r->last_stats().reused);
  EXPECT_EQ(r->last_stats().uploaded_bytes, 0u);
  EXPECT_EQ(r->last_stats().kv_blocks, s.kv_blocks.size());
  EXPECT_LT(red_calm, 50);
  EXPECT_GT(red_flash, 5000);
}

// Without a revision the renderer compares with what it sent and sends only the change;
// the picture follows the change.
TEST(RenderPixels, UnrevisionedSceneSendsOnlyTheChangedRange) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::Scene s = bare_scene(10, 8);
  for (auto& k : s.kv_blocks) k.recompute = 0.0f;
  frame_scene(&s, CameraPreset::ThreeQuarter, kW, kH);
  render_image(*r, s, kW, kH);
  size_t full = r->last_stats().uploaded_bytes;
  render_image(*r, s, kW, kH);
  EXPECT_EQ(r->last_stats().uploaded_bytes, 0u);
  EXPECT_LT(count_red(render_image(*r, s, kW, kH)), 50);
  s.kv_blocks[s.kv_blocks.size() / 2].recompute = 1.0f;  // one block turns red
  int red = count_red(render_image(*r, s, kW, kH));
  size_t sent = r->last_stats().uploaded_bytes;
  EXPECT_GT(sent, 0u);
  EXPECT_LT(sent, 64u);
  EXPECT_LT(sent * 100, full);
  EXPECT_GT(red, 30);
}

TEST(RenderPixels, OnlyTheInstancesInViewAreDrawnAndTheImageIsTheSame) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::SyntheticSpec spec;
  spec.n_tokens = 1500;
  spec.n_layers = 12;
  render::Scene s = render::make_synthetic_scene(spec);
  s.beam_lod = false;  // changes the picture on purpose (BeamsOutOfViewAreThinned)
  for (CameraPreset p : {CameraPreset::ThreeQuarter, CameraPreset::Follow, CameraPreset::Top}) {
    frame_scene(&s, p, kW, kH);
    s.cull_offscreen = true;
    s.revision = render::next_scene_revision();
    Image culled = render_image(*r, s, kW, kH);
    render::FrameStats st = r->last_stats();
    s.cull_offscreen = false;
    Image full = render_image(*r, s, kW, kH);
    EXPECT_EQ(r->last_stats().drawn_kv_blocks, s.kv_blocks.size());
    int differ = 0;
    for (size_t i = 0; i < culled.rgba.size(); ++i) differ += culled.rgba[i] != full.rgba[i];
    EXPECT_EQ(differ, 0) << render::camera_preset_name(p);
    if (p == CameraPreset::Top) {
      EXPECT_EQ(st.drawn_tokens, s.tokens.size());  // everything is in view from above
    } else {
      EXPECT_LT(st.drawn_tokens, s.tokens.size() / 4) << render::camera_preset_name(p);
      EXPECT_LT(st.drawn_kv_blocks, s.kv_blocks.size() / 4) << render::camera_preset_name(p);
      EXPECT_GT(st.drawn_tokens, 8u);
    }
  }
}

// Level of detail for beams: over a long sequence seen from 3/4, the beams to tokens out of
// view are thinned to 96, each the strongest of its stretch, besides the beams to the
// tokens in view; from above everything is in view and every beam is drawn. The picture
// keeps most of its light.
TEST(RenderPixels, BeamsOutOfViewAreThinned) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  render::SyntheticSpec spec;
  spec.n_tokens = 4096;
  spec.n_layers = 30;
  render::Scene s = render::make_synthetic_scene(spec);
  for (CameraPreset p : {CameraPreset::ThreeQuarter, CameraPreset::Top}) {
    frame_scene(&s, p, kW, kH);
    s.revision = render::next_scene_revision();
    s.beam_lod = true;
    Image lod = render_image(*r, s, kW, kH);
    const render::FrameStats st = r->last_stats();
    s.beam_lod = false;
    Image all = render_image(*r, s, kW, kH);
    EXPECT_EQ(r->last_stats().drawn_beams, st.beams);
    if (p == CameraPreset::Top) {
      EXPECT_EQ(st.drawn_beams, st.beams) << "everything is in view from above";
      continue;
    }
    ASSERT_GT(st.drawn_tokens, 8u);
    EXPECT_LT(st.drawn_beams, st.beams / 2);
    EXPECT_GE(st.drawn_beams, 96u);  // the thinned ones, and those to the tokens in view
    // The head and the newest tokens look the same: the head's neighbourhood keeps its light.
    double lit_lod = 0, lit_all = 0;
    for (size_t i = 0; i < lod.rgba.size(); i += 4) {
      lit_lod += lod.rgba[i] + lod.rgba[i + 1] + lod.rgba[i + 2];
      lit_all += all.rgba[i] + all.rgba[i + 1] + all.rgba[i + 2];
    }
    EXPECT_GT(lit_lod, 0.6 * lit_all);
  }
}
