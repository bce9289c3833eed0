// test_replay_pixels.cpp — record -> replay gives the same frame and the same numbers, and a
// step looked at again through the history gives the frame it had when it was the newest.
//
// A real run of the default model is recorded twice (attention f32 and f16), replayed from
// the files without the model, and drawn at 1280x720 in two camera presets:
//   - f32 recording: pixel-identical frames;
//   - f16 recording: attention rounded to 11 significant bits, so where many faint beams
//     add up a pixel may move a little: at most 0.05% of the pixels differ, none by more
//     than 16/255 (measured: 108 pixels, 12/255 at most, in the TOP preset);
//   - both: the per-step CSV of the replay equals the live run's, byte for byte.
// Scrubbing the live timeline back to step 8 of 16 (read from the history store) draws the
// same pixels as a run that stopped after 8 steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "app/scene/capture.h"
#include "app/core/engine_setup.h"
#include "app/core/replay_source.h"
#include "app/core/run_driver.h"
#include "app/core/stats_csv.h"
#include "gl_test_context.h"

using namespace kvscope;
using namespace kvscope::app;

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

    Frames a = draw(*r, live), b = draw(*r, replay);
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
  for (size_t i = 0; i < a.images.size(); ++i) {
    Diff dd = diff(a.images[i], b.images[i]);
    EXPECT_EQ(dd.pixels, 0u) << "preset " << i << ": max diff " << dd.max_level;
  }
  // And back to the newest step: the full run's frame again.
  full.follow_live();
  EXPECT_TRUE(full.live());
  EXPECT_EQ(full.viewed()->step, kSteps);
}
