// test_replay_pixels.cpp — record -> replay gives the same frame and the same numbers, and a
// step looked at again through the history gives the frame it had when it was the newest.
//
// A real run of the default model is recorded twice (attention f32 and f16), replayed from
// the files without the model, and drawn at 1280x720 in two camera presets:
//   - f32 recording: pixel-identical frames;
//   - f16 recording: attention rounded to 11 significant bits, so where many faint beams
//     add up a pixel may move a little: at most 0.05% of the pixels differ, none by more
//     than 16/255 (measured: 108 pixels, 12/255 at most, in the TOP preset);
//   - both: the per-step CSV of the replay equals the live run's, byte for byte; the replay
//     holds 16 steps of one token each at the positions after the live run's prompt.
// Scrubbing the live timeline back to step 8 of 16 (read from the history store) draws the
// same pixels as a run that stopped after 8 steps.
// Besides equal to another render, the replayed and the scrubbed frames are read for what the
// run puts in them, where the documented layout (expected_layout) and the frame's camera
// (to_screen, from the camera's own numbers) put it: from above every slot up to the run's
// length in its colour (the prompt's blue-grey, then the generated orange); the write head
// above the next slot; from 3/4 the newest token, an empty slot after it, and over it a label
// that reads the token's text (its glyphs, drawn alone with the same camera, all in the frame).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <string>

#include "app/core/engine_setup.h"
#include "app/core/replay_source.h"
#include "app/core/run_driver.h"
#include "app/core/stats_csv.h"
#include "app/scene/capture.h"
#include "gl_test_context.h"
#include "pixel_utils.h"
#include "render/offscreen.h"
#include "render/synthetic_scene.h"
#include "tests/render/expected_layout.h"

// Expected positions come from the documented geometry, not render::layout.
namespace expected_layout = kvscope::test::expected_layout;

using namespace kvscope;
using namespace kvscope::app;
using kvscope::test::Image;

namespace {

constexpr int kW = 1280, kH = 720, kSteps = 16;
const PromptSpec kPrompt{"Once upon a time, in a kingdom far away, there lived", false};

std::unique_ptr<StepSource> live_source(int max_tokens) {
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  eo.max_tokens = max_tokens;
  auto eng = open_engine(eo);
  EXPECT_TRUE(eng.ok()) << (eng.ok() ? "" : eng.error().message);
  if (!eng.ok()) return nullptr;
  return make_session_source(std::move(eng.value().session));
}

RunMeta meta_of(const StepSource& s, AttnEncoding enc) {
  RunMeta m;
  m.producer = "kvscope test";
  m.model = s.facts();
  m.prompt = kPrompt;
  m.mode = s.mode();
  m.sampler = s.sampler();
  m.max_tokens = s.max_tokens();
  m.attention = enc;
  return m;
}

struct Frames {
  std::vector<std::vector<uint8_t>> images;  // one per preset
  std::vector<render::Scene> scenes;         // what each was drawn from (its camera)
};

const render::CameraPreset kPresets[] = {render::CameraPreset::ThreeQuarter,
                                         render::CameraPreset::Top};

Frames draw(render::Renderer& r, const Timeline& tl) {
  Frames f;
  for (render::CameraPreset p : kPresets) {
    render::Scene s = capture_scene(tl, ViewOptions{}, 2.0, p, kW, kH);
    auto px = render_offscreen(r, s, kW, kH);
    EXPECT_TRUE(px.ok()) << (px.ok() ? "" : px.error().message);
    f.images.push_back(px.ok() ? px.value() : std::vector<uint8_t>());
    f.scenes.push_back(std::move(s));
    // KVSCOPE_TEST_DUMP=DIR saves every frame for a person to look at.
    if (const char* dir = std::getenv("KVSCOPE_TEST_DUMP"); dir && px.ok()) {
      static int counter = 0;
      std::vector<uint8_t> rgba = px.value();
      for (size_t i = 3; i < rgba.size(); i += 4) rgba[i] = 255;
      (void)render::write_png(std::string(dir) + "/replay_" + std::to_string(counter++) + ".png",
                              kW, kH, rgba);
    }
  }
  return f;
}

struct Diff {
  int max_level = 0;
  size_t pixels = 0;
};
Diff diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  Diff d;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i + 3 < std::min(a.size(), b.size()); i += 4) {
    int m = 0;
    for (int c = 0; c < 3; ++c) m = std::max(m, std::abs(int(a[i + c]) - int(b[i + c])));
    d.max_level = std::max(d.max_level, m);
    d.pixels += m > 0;
  }
  return d;
}

int prompt_tokens(const Timeline& tl) {
  int n = 0;
  for (const TokenInfo& t : tl.tokens()) n += t.prompt;
  return n;
}

// Each position's token text as a label shows it.
std::vector<std::string> label_texts(const Timeline& tl) {
  std::vector<std::string> out;
  for (const TokenInfo& t : tl.tokens()) out.push_back(display_text(t.text));
  return out;
}

bool is_prompt_token(glm::vec3 c) {  // the dim blue-grey of a prompt token's face
  return c.b > 0.2f && c.b > c.r + 0.05f && c.b >= c.g;
}
bool is_generated_token(glm::vec3 c) {  // the orange of a generated token's face
  return c.r > 0.45f && c.r > c.g + 0.2f && c.r > c.b + 0.25f;
}
bool is_head_light(glm::vec3 c) {  // the write head's warm light
  return c.r > 0.8f && c.g > 0.6f && c.b < c.g;
}
bool is_text(glm::vec3 c) {  // a label's light grey glyph pixels (beams are blue)
  return 0.2126f * c.r + 0.7152f * c.g + 0.0722f * c.b > 0.6f &&
         std::max({c.r, c.g, c.b}) - std::min({c.r, c.g, c.b}) < 0.15f;
}

// The share of the pixels within (rx, ry) of where `world` lands in a frame of `s` that
// `pred` accepts; `where` says what the centre pixel looks like (for messages).
template <class Pred>
float share_at(const Image& img, const render::Scene& s, glm::vec3 world, int rx, int ry, Pred pred,
               std::string* where) {
  const glm::vec2 c = kvscope::test::to_screen(s, world, kW, kH);
  *where = kvscope::test::pixel_note(img, c);
  return kvscope::test::share_around(img, c, rx, ry, pred);
}

// Token `pos`'s label in `img` (a frame of `s`) against `text` drawn as that token's only
// label, by a scene of that one token with the same camera and label settings: how many
// text pixels the reference has in the band over the token, and the share of them the frame
// has too. The frame may have more (beams and the head's light cross the band); a label
// that reads `text` has all of them.
struct LabelMatch {
  int ref_pixels = 0;
  float found = 0.0f;
};
LabelMatch label_match(render::Renderer& r, const Image& img, const render::Scene& s, int pos,
                       const std::string& text) {
  render::Scene ref;
  ref.camera = s.camera;
  ref.label_height = s.label_height;
  ref.label_fit_px = s.label_fit_px;
  ref.labels_vertical = s.labels_vertical;
  ref.haze = s.haze;
  ref.head.visible = false;
  ref.grid.visible = false;
  render::TokenInstance t;
  t.position = expected_layout::token_position(pos);
  t.color = render::palette::kGeneratedToken;
  t.label = text;
  t.label_min_px = kReadableLabelPx;  // the newest token's, as the scene documents
  ref.tokens.push_back(t);
  auto px = render_offscreen(r, ref, kW, kH);
  EXPECT_TRUE(px.ok());
  LabelMatch m;
  if (!px.ok()) return m;
  const Image want{kW, kH, px.value()};
  const glm::vec3 at = expected_layout::token_position(pos);
  const glm::vec2 lo = kvscope::test::to_screen(s, at + glm::vec3(0, 0.5f, 0), kW, kH);
  const glm::vec2 hi = kvscope::test::to_screen(s, at + glm::vec3(0, 4.0f, 0), kW, kH);
  int both = 0;
  for (int y = int(hi.y) - 10; y <= int(lo.y); ++y)
    for (int x = int(std::min(lo.x, hi.x)) - 12; x <= int(std::max(lo.x, hi.x)) + 12; ++x) {
      if (!img.inside(x, y) || !is_text(want.at(x, y))) continue;
      ++m.ref_pixels;
      both += is_text(img.at(x, y));
    }
  m.found = m.ref_pixels ? float(both) / float(m.ref_pixels) : 0.0f;
  return m;
}

// What the recorded run puts in its frames, read from the pixels where the documented layout
// and each frame's camera put it (not by comparing with another render): `n_prompt` prompt
// tokens then the generated ones up to `seq_len`, each slot in its colour from above (TOP);
// the write head above slot `seq_len` in both presets; from 3/4 the newest token in its slot,
// nothing in the slot after it, and its label's text over it.
void expect_frames_show_run(render::Renderer& r, const Frames& f, int n_prompt, int seq_len,
                            const std::vector<std::string>& texts) {
  ASSERT_EQ(f.images.size(), std::size(kPresets));
  std::string where;
  for (size_t i = 0; i < f.images.size(); ++i) {
    const render::CameraPreset p = kPresets[i];
    SCOPED_TRACE(render::camera_preset_name(p));
    const Image img{kW, kH, f.images[i]};
    const render::Scene& s = f.scenes[i];
    EXPECT_GE(
        share_at(img, s, expected_layout::head_position(seq_len), 1, 1, is_head_light, &where),
        0.6f)
        << "no write head above slot " << seq_len << where;
    if (p == render::CameraPreset::Top) {
      // The near half of each top face (beams land at its middle).
      for (int pos = 0; pos < seq_len; ++pos) {
        const glm::vec3 face = expected_layout::token_position(pos) + glm::vec3(0, 0.4f, 0.2f);
        if (pos < n_prompt)
          EXPECT_GE(share_at(img, s, face, 2, 2, is_prompt_token, &where), 0.6f)
              << "prompt token " << pos << where;
        else
          EXPECT_GE(share_at(img, s, face, 2, 2, is_generated_token, &where), 0.6f)
              << "generated token " << pos << where;
      }
    } else {
      auto front = [](int pos) {
        return expected_layout::token_position(pos) + glm::vec3(0, 0, 0.4f);
      };
      EXPECT_GE(share_at(img, s, front(seq_len - 1), 2, 2, is_generated_token, &where), 0.6f)
          << "the newest token" << where;
      EXPECT_LE(share_at(img, s, front(seq_len), 2, 2, is_generated_token, &where), 0.2f)
          << "a token in the slot after the newest" << where;
      // The newest token's label reads its text: every text pixel of that text drawn alone
      // (same camera, same place) is in the frame; not so for the text reversed, nor for the
      // text with more after it.
      const std::string& text = texts[size_t(seq_len - 1)];
      const LabelMatch m = label_match(r, img, s, seq_len - 1, text);
      EXPECT_GE(m.ref_pixels, 20) << "'" << text << "' is too small to read";
      EXPECT_GE(m.found, 0.9f) << "the newest token's label does not read '" << text << "'";
      const std::string reversed(text.rbegin(), text.rend());
      const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return c > 0; });
      if (ascii && reversed != text) {
        EXPECT_LT(label_match(r, img, s, seq_len - 1, reversed).found, m.found - 0.3f)
            << "the label reads '" << reversed << "' as well as '" << text << "'";
      }
      EXPECT_LT(label_match(r, img, s, seq_len - 1, text + "xyz").found, 0.9f)
          << "the label goes on after '" << text << "'";
    }
  }
}

}  // namespace

class ReplayPixels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model not found";
  }
};

TEST_F(ReplayPixels, RecordThenReplayGivesTheSameFrameAndNumbers) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  for (AttnEncoding enc : {AttnEncoding::F32, AttnEncoding::F16}) {
    SCOPED_TRACE(attn_encoding_name(enc));
    auto src = live_source(kSteps);
    ASSERT_TRUE(src);
    const std::string path = ::testing::TempDir() + "/replay_" + attn_encoding_name(enc) + ".kvs";
    auto file = RunFile::create(path, meta_of(*src, enc));
    ASSERT_TRUE(file.ok());
    Timeline live;
    std::ostringstream live_csv, replay_csv;
    write_stats_csv_header(live_csv);
    write_stats_csv_header(replay_csv);
    DriveOptions d;
    d.steps = kSteps;
    d.record = file.value();
    d.timeline = &live;
    d.on_step = [&](const StepTrace& t) { write_stats_csv_row(live_csv, t); };
    ASSERT_TRUE(drive_run(*src, kPrompt, d).ok());
    file.value().reset();

    auto rep = open_replay(path);  // no model involved from here on
    ASSERT_TRUE(rep.ok()) << rep.error().message;
    Timeline replay;
    DriveOptions dr;
    dr.steps = kSteps;
    dr.timeline = &replay;
    dr.on_step = [&](const StepTrace& t) { write_stats_csv_row(replay_csv, t); };
    ASSERT_TRUE(drive_run(*rep.value(), {}, dr).ok());
    EXPECT_EQ(replay_csv.str(), live_csv.str()) << "the replay's numbers differ";
    EXPECT_EQ(replay.prompt_text(), kPrompt.text);
    EXPECT_EQ(replay.generated_text(), live.generated_text());
    // What the file holds, counted: the live run's prompt, then kSteps steps of one token each
    // at the positions after it.
    const int n_prompt = prompt_tokens(live);
    ASSERT_GT(n_prompt, 0);
    ASSERT_EQ(int(replay.steps().size()), kSteps);
    for (int k = 0; k < kSteps; ++k) {
      EXPECT_EQ(replay.steps()[size_t(k)]->step, k + 1);
      EXPECT_EQ(replay.steps()[size_t(k)]->pos, n_prompt + k);
    }
    EXPECT_EQ(int(replay.tokens().size()), n_prompt + kSteps);

    Frames a = draw(*r, live), b = draw(*r, replay);
    {
      SCOPED_TRACE("the replayed frames");
      expect_frames_show_run(*r, b, n_prompt, n_prompt + kSteps, label_texts(live));
    }
    for (size_t i = 0; i < a.images.size(); ++i) {
      Diff dd = diff(a.images[i], b.images[i]);
      if (enc == AttnEncoding::F32) {
        EXPECT_EQ(dd.pixels, 0u) << "preset " << i << ": max diff " << dd.max_level;
      } else {
        EXPECT_LE(dd.max_level, 16) << "preset " << i << ", " << dd.pixels << " pixels differ";
        EXPECT_LE(dd.pixels, size_t(kW) * kH / 2000) << "preset " << i;
      }
    }
  }
}

TEST_F(ReplayPixels, ScrubbedStepDrawsAsItWasThen) {
  GL_TEST_CONTEXT_OR_SKIP(ctx);
  auto r = ctx->make_renderer();
  ASSERT_TRUE(r);
  constexpr int kBack = 8;
  // The whole run, kept in a store as the app's spool keeps it (f32: exact).
  auto src = live_source(kSteps);
  ASSERT_TRUE(src);
  auto file =
      RunFile::create(::testing::TempDir() + "/scrub.kvs", meta_of(*src, AttnEncoding::F32));
  ASSERT_TRUE(file.ok());
  Timeline full;
  DriveOptions d;
  d.steps = kSteps;
  d.record = file.value();
  d.timeline = &full;
  ASSERT_TRUE(drive_run(*src, kPrompt, d).ok());
  // The same run, stopped after kBack steps.
  auto src8 = live_source(kSteps);
  ASSERT_TRUE(src8);
  Timeline then;
  DriveOptions d8;
  d8.steps = kBack;
  d8.timeline = &then;
  ASSERT_TRUE(drive_run(*src8, kPrompt, d8).ok());

  full.scrub_to(kBack);
  ASSERT_EQ(full.viewed_step(), kBack);
  ASSERT_EQ(full.viewed_note(), "");
  ASSERT_TRUE(full.viewed());
  EXPECT_EQ(full.viewed()->attention, then.last()->attention);
  Frames a = draw(*r, full), b = draw(*r, then);
  {
    SCOPED_TRACE("the scrubbed frames");
    const int n_prompt = prompt_tokens(then);
    ASSERT_GT(n_prompt, 0);
    expect_frames_show_run(*r, a, n_prompt, n_prompt + kBack, label_texts(then));
  }
  for (size_t i = 0; i < a.images.size(); ++i) {
    Diff dd = diff(a.images[i], b.images[i]);
    EXPECT_EQ(dd.pixels, 0u) << "preset " << i << ": max diff " << dd.max_level;
  }
  // And back to the newest step: the full run's frame again.
  full.follow_live();
  EXPECT_TRUE(full.live());
  EXPECT_EQ(full.viewed()->step, kSteps);
}
