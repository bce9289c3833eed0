// test_serving_capture.cpp — the whole Serving view (panels and 3D view, 1280x720,
// app/ui/serving_capture.h) captured while the continuous-batching scheduler serves a
// workload on the default model, one step at a time, and read back from its pixels:
//   - the pool grid shows as many occupied tiles as the engine reports used blocks (each
//     tile classified by the pixel at its projected centre), before, during and after
//     the requests finish (cached tiles must not read as occupied);
//   - a copy-on-write (two samples of one prompt) is visible in the capture of its step:
//     the Cow tile flashes (brighter and whiter just after the step than once settled);
//   - a preemption (a pool too small for everyone) is visible: the preempted lane's tokens
//     are grey while the running lanes' are coloured, and the blocks it gave back are no
//     longer occupied tiles;
//   - a recorded serving run replays into the same capture (`kvscope --view serving --replay
//     RUN --screenshot OUT`): the replayed snapshot's pool reads as the live one's did.
// KVSCOPE_TEST_DUMP=DIR saves every capture for a person to look at.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "app/core/serving_record.h"
#include "app/ui/serving_capture.h"
#include "app/ui/ui_state.h"
#include "gl_test_context.h"
#include "pixel_utils.h"
#include "render/offscreen.h"

using namespace kvscope;
using namespace kvscope::app;
using kvscope::test::Image;

namespace {

constexpr int kW = 1280, kH = 720;

EngineOptions engine_options() {
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  eo.threads = 2;
  return eo;
}

// Short prompts (a few tokens each, after the shared system prompt).
const std::vector<PromptSpec> kShort = {
    {"The capital of France is", false},
    {"def add(a, b):\n    return", false},
    {"Once upon a time, a small fox", false},
    {"The three primary colours are", false},
};

// About 70 tokens each: five blocks of 16 with what they generate.
const std::vector<PromptSpec> kLong = {
    {"The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a "
     "lantern, a notebook and a flask of tea. He wrote down the colour of the sea, the shape "
     "of the clouds and the names of the ships that passed. One night a ship he had never seen "
     "before appeared on the horizon, and",
     false},
    {"In a small village at the edge of a great forest, the baker woke before sunrise to light "
     "the ovens. The smell of fresh bread drifted through the narrow streets, waking the "
     "children and the dogs. That morning, however, a stranger was already waiting at the "
     "door of the bakery, holding a map, and",
     false},
    {"The research team had spent three years building the telescope on the mountain. On the "
     "first clear night they pointed it at a faint patch of sky that nobody had studied "
     "closely. The images that came back were strange: a ring of light, too regular to be "
     "natural, slowly turning, and",
     false},
    {"Every summer the river flooded the lower fields, and every summer the farmers moved "
     "their animals to the hills. This year the water rose faster than anyone remembered. "
     "The youngest daughter of the miller was the first to notice that the old stone bridge "
     "had started to crack, so",
     false},
    {"The train left the city a few minutes after midnight, almost empty. In the last "
     "carriage a woman in a green coat read a letter again and again, folding and unfolding "
     "it. When the conductor came to check her ticket she asked him, quietly, whether the "
     "train still stopped at the old station by the lake, and",
     false},
};

struct Harness {
  std::unique_ptr<test::GlTestContext> ctx;
  std::unique_ptr<render::Renderer> renderer;
  UiState ui;
  ServingUi s;
};

float luma(glm::vec3 c) {
  return 0.3f * c.r + 0.55f * c.g + 0.15f * c.b;
}
float chroma(glm::vec3 c) {
  return std::max({c.r, c.g, c.b}) - std::min({c.r, c.g, c.b});
}

// The mean of the 3x3 pixels around p.
glm::vec3 sample(const Image& img, glm::vec2 p) {
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

// An occupied tile's face is its owner's colour, lit (brightness 0.78..0.9): bright and
// saturated. A free tile is dark grey (serving_free_color at 0.45), a cached one its
// owner's hue washed toward that grey at 0.3: both dark. The brightest channel tells them
// apart with a wide margin (see the printed values); stripes on a shared tile darken one
// shade of two, so the brighter of the centre and two points beside it is used.
constexpr float kOccupiedMin = 0.37f;

struct Capture {
  std::shared_ptr<const ServingSnapshot> snap;
  Image img;
};

Capture capture(Harness& h, std::shared_ptr<const ServingSnapshot> snap, double since_step) {
  h.s.snap = snap;
  h.s.last_step = snap->step;
  h.s.playing = false;
  AppShot shot;
  shot.width = kW;
  shot.height = kH;
  shot.since_step = since_step;
  auto r = capture_serving(*h.renderer, h.ui, h.s, shot);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  Capture c;
  c.snap = std::move(snap);
  if (!r.ok()) return c;
  c.img = Image{kW, kH, r.value().rgba};
  if (const char* dir = std::getenv("KVSCOPE_TEST_DUMP")) {
    static int counter = 0;
    const std::string path = std::string(dir) + "/serving_capture_" + std::to_string(counter++) +
                             "_step" + std::to_string(c.snap->step) + ".png";
    for (size_t i = 3; i < c.img.rgba.size(); i += 4) c.img.rgba[i] = 255;
    (void)render::write_png(path, kW, kH, c.img.rgba);
  }
  return c;
}

// The pixel at tile b's face centre (false when it is outside the view).
bool tile_pixel(const Harness& h, const Image& img, int b, glm::vec3* out, float dx = 0.0f) {
  const ServingGeometry& g = h.s.view.geometry();
  const glm::vec3 face =
      g.tile_center(b) + glm::vec3(dx * g.tile_size, 0.0f, 0.5f * h.s.view.scene().kv_block_size.z);
  glm::vec2 p;
  if (!h.s.view.project(face, &p)) return false;
  *out = sample(img, p);
  return true;
}

float tile_brightest(const Harness& h, const Image& img, int b) {
  float best = 0.0f;
  for (float dx : {0.0f, -0.12f, 0.12f}) {
    glm::vec3 c;
    if (tile_pixel(h, img, b, &c, dx)) best = std::max(best, std::max({c.r, c.g, c.b}));
  }
  return best;
}

// Every tile classified from the capture: the occupied ones (ids).
std::vector<int> occupied_tiles(const Harness& h, const Capture& c) {
  std::vector<int> out;
  const ServingSnapshot& s = *c.snap;
  for (int b = 0; b < s.n_blocks; ++b) {
    glm::vec3 px;
    EXPECT_TRUE(tile_pixel(h, c.img, b, &px)) << "tile " << b << " is outside the view";
    if (tile_brightest(h, c.img, b) > kOccupiedMin) out.push_back(b);
  }
  return out;
}

// The pool in the capture against the engine's count: prints both, and checks that the
// occupied tiles are exactly the Used ones.
void expect_pool_matches(const Harness& h, const Capture& c) {
  const ServingSnapshot& s = *c.snap;
  SCOPED_TRACE("step " + std::to_string(s.step));
  ASSERT_FALSE(s.history.empty());
  const ServingPoint& p = s.history.back();
  const std::vector<int> occ = occupied_tiles(h, c);
  int used = 0;
  float used_min = 1.0f, other_max = 0.0f;
  for (int b = 0; b < s.n_blocks; ++b) {
    const bool is_used = s.tiles[size_t(b)].state == TileState::Used;
    used += is_used;
    const float v = tile_brightest(h, c.img, b);
    (is_used ? used_min : other_max) = is_used ? std::min(used_min, v) : std::max(other_max, v);
    const bool reads_occupied = std::find(occ.begin(), occ.end(), b) != occ.end();
    EXPECT_EQ(reads_occupied, is_used)
        << "tile " << b << " is " << (is_used ? "used" : "not used") << " (refs "
        << s.tiles[size_t(b)].refs << ") but its brightest channel is " << v;
  }
  std::printf(
      "step %d: %d occupied tiles in the capture; the pool reports %d used, %d cached, %d "
      "free (Used tiles %d); darkest used tile %.2f, brightest other %.2f\n",
      s.step, int(occ.size()), p.used, p.cached, p.free, used, double(used_min), double(other_max));
  EXPECT_EQ(int(occ.size()), p.used);
  EXPECT_EQ(used, p.used);
}

// A settled capture of `snap` (2 s after its step), its pool read back and checked against
// the engine's (expect_pool_matches).
Capture capture_checked(Harness& h, std::shared_ptr<const ServingSnapshot> snap) {
  Capture c = capture(h, std::move(snap), 2.0);
  expect_pool_matches(h, c);
  return c;
}

void open(Harness& h) {
  h.ui.engine_options = engine_options();
  h.s.run = std::make_unique<ServingRun>(h.ui.engine_options);
  h.s.started = true;  // the toolbar shows the run's step, as after Start
}

// Steps the paused run to `step` and returns its snapshot (error-free, at that step).
std::shared_ptr<const ServingSnapshot> step_to(ServingRun& run, int step) {
  run.wait_until(step, 120);
  auto s = run.snapshot();
  EXPECT_TRUE(s->error.empty()) << s->error;
  return s;
}

// Every case: the default model (a failure when absent), a GL context (a skip when there is
// none), a renderer, and a Serving view opened on the model.
class ServingCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(KVSCOPE_DEFAULT_MODEL))
        << "default model " << KVSCOPE_DEFAULT_MODEL << " absent: run scripts/fetch_model.sh";
    GL_TEST_CONTEXT_OR_SKIP(ctx);
    h.ctx = std::move(ctx);
    h.renderer = h.ctx->make_renderer();
    ASSERT_TRUE(h.renderer);
    open(h);
  }
  Harness h;
};

TEST_F(ServingCapture, OccupiedTilesEqualTheEnginesUsedBlocks) {
  ServingSettings set;
  set.requests = 4;
  set.every = 1;
  set.max_tokens = 6;
  set.temperature = 0.0f;
  set.pool_blocks = 48;
  h.s.settings = set;
  ServingConfig cfg = serving_config(set, kShort);
  h.s.run->start(cfg, /*play=*/false);
  int captured = 0, max_used = 0;
  bool cached_seen = false;
  for (int k = 1; k <= 30; ++k) {
    auto snap = step_to(*h.s.run, k);
    ASSERT_TRUE(snap->error.empty());
    ASSERT_EQ(snap->step, k);
    const ServingPoint& p = snap->history.back();
    // Capture a step while requests run, the step with the most blocks in use, the end.
    const bool want = k == 2 || k == 5 || snap->done;
    if (want) {
      capture_checked(h, snap);
      ++captured;
      max_used = std::max(max_used, p.used);
      cached_seen |= p.cached > 0;
    }
    if (snap->done) break;
  }
  EXPECT_EQ(captured, 3) << "the run did not finish in 30 steps";
  EXPECT_GE(max_used, 4) << "too few blocks in use to tell anything";
  EXPECT_TRUE(cached_seen) << "the shared prefix's blocks stay cached after the requests end";
}

TEST_F(ServingCapture, ACopyOnWriteFlashesInTheCaptureOfItsStep) {
  ServingSettings set;
  set.requests = 1;
  set.n = 2;
  set.temperature = 0.8f;
  set.max_tokens = 4;
  set.pool_blocks = 24;
  h.s.settings = set;
  h.s.run->start(serving_config(set, kShort), /*play=*/false);
  std::shared_ptr<const ServingSnapshot> at;
  for (int k = 1; k <= 12 && !at; ++k) {
    auto snap = step_to(*h.s.run, k);
    ASSERT_TRUE(snap->error.empty());
    for (const SchedEvent& e : snap->events)
      if (e.kind == EventKind::Cow) at = snap;
    if (snap->done) break;
  }
  ASSERT_TRUE(at) << "no copy-on-write in 12 steps of two samples";
  int cow = -1;
  for (int b = 0; b < at->n_blocks; ++b)
    if (at->tiles[size_t(b)].flash == TileFlash::Cow) cow = b;
  ASSERT_GE(cow, 0) << "a Cow event with no Cow tile at step " << at->step;
  Capture early = capture(h, at, 0.05);
  Capture settled = capture_checked(h, at);  // and the pool reads right at that step too
  glm::vec3 e, s;
  ASSERT_TRUE(tile_pixel(h, early.img, cow, &e));
  ASSERT_TRUE(tile_pixel(h, settled.img, cow, &s));
  std::printf("step %d: copy-on-write tile %d: %.2f,%.2f,%.2f at 0.05 s, %.2f,%.2f,%.2f at 2 s\n",
              at->step, cow, double(e.r), double(e.g), double(e.b), double(s.r), double(s.g),
              double(s.b));
  EXPECT_GT(luma(e), luma(s) + 0.12f) << "the Cow tile does not flash brighter";
  EXPECT_GT(std::min({e.r, e.g, e.b}), std::min({s.r, s.g, s.b}) + 0.12f)
      << "the Cow tile does not flash whiter";
  // A tile the step did not touch looks the same in both.
  for (int b = 0; b < at->n_blocks; ++b) {
    if (at->tiles[size_t(b)].flash != TileFlash::None) continue;
    glm::vec3 a, z;
    ASSERT_TRUE(tile_pixel(h, early.img, b, &a));
    ASSERT_TRUE(tile_pixel(h, settled.img, b, &z));
    EXPECT_NEAR(luma(a), luma(z), 0.06f) << "tile " << b << " changed with the clock alone";
  }
}

TEST_F(ServingCapture, APreemptionShowsAsAGreyLaneAndFreedTiles) {
  ServingSettings set;
  set.requests = int(kLong.size());
  set.use_prefix = false;
  set.arrival_kind = 0;  // all at once
  set.max_tokens = 40;
  set.temperature = 0.0f;
  set.context = 128;
  set.pool_blocks = 14;
  set.max_batch_tokens = 128;
  h.s.settings = set;
  ServingConfig cfg = serving_config(set, kLong);
  cfg.scheduler.stop_at_eos = false;  // every request holds its blocks to the end
  h.s.run->start(cfg, /*play=*/false);
  std::shared_ptr<const ServingSnapshot> prev, at;
  int preempted = -1;
  for (int k = 1; k <= 60 && !at; ++k) {
    auto snap = step_to(*h.s.run, k);
    ASSERT_TRUE(snap->error.empty());
    ASSERT_EQ(snap->step, k);
    for (const SchedEvent& e : snap->events)
      if (e.kind == EventKind::Preempt && !at) {
        at = snap;
        preempted = e.seq;
      }
    if (!at) prev = snap;
    if (snap->done) break;
  }
  ASSERT_TRUE(at) << "no preemption in 60 steps with 14 blocks";
  ASSERT_TRUE(prev);
  const Lane* lane = nullptr;
  for (const Lane& l : at->lanes)
    if (l.seq == preempted) lane = &l;
  ASSERT_TRUE(lane);
  ASSERT_EQ(lane->state, LaneState::Preempted);
  Capture c = capture_checked(h, at);

  // The preempted lane's tokens are grey; a running lane's generated ones are coloured.
  const ServingGeometry& g = h.s.view.geometry();
  const float zt = 0.5f * h.s.view.scene().token_size.z;
  auto lane_chroma = [&](const Lane& l, int from, int to, float* mean) {
    const int k = serving_lane_of(g, l.seq);
    EXPECT_GE(k, 0) << "seq " << l.seq << " is not drawn";
    int n = 0;
    float sum = 0.0f;
    for (int pos = from; pos < to && k >= 0; ++pos) {
      glm::vec2 p;
      if (!h.s.view.project(g.token_center(k, pos) + glm::vec3(0, 0, zt), &p)) continue;
      sum += chroma(sample(c.img, p));
      ++n;
    }
    *mean = n ? sum / float(n) : -1.0f;
    return n;
  };
  float grey = 0.0f;
  ASSERT_GT(lane_chroma(*lane, 0, int(lane->ids.size()), &grey), 10);
  int running = 0;
  for (const Lane& l : at->lanes) {
    if (l.state != LaneState::Running || int(l.ids.size()) <= l.prompt_tokens + 2) continue;
    float col = 0.0f;
    if (lane_chroma(l, l.prompt_tokens, int(l.ids.size()), &col) < 3) continue;
    std::printf("step %d: running seq %d's generated tokens: mean chroma %.2f\n", at->step, l.seq,
                double(col));
    EXPECT_GT(col, 0.2f) << "running seq " << l.seq << " is not coloured";
    ++running;
  }
  std::printf("step %d: preempted seq %d (%d tokens): mean chroma %.2f\n", at->step, preempted,
              int(lane->ids.size()), double(grey));
  EXPECT_LT(grey, 0.08f) << "the preempted lane is not grey";
  EXPECT_GE(running, 1) << "no running lane with generated tokens to compare with";

  // The blocks it held before the step: each is either given back (not occupied in the
  // capture) or already someone else's (occupied, and Used by another sequence).
  const Lane* before = nullptr;
  for (const Lane& l : prev->lanes)
    if (l.seq == preempted) before = &l;
  ASSERT_TRUE(before);
  ASSERT_FALSE(before->table.empty());
  const std::vector<int> occ = occupied_tiles(h, c);
  int given_back = 0, taken = 0;
  for (int32_t b : before->table) {
    const PoolTile& t = at->tiles[size_t(b)];
    const bool reads_occupied = std::find(occ.begin(), occ.end(), int(b)) != occ.end();
    EXPECT_EQ(std::find(t.owners.begin(), t.owners.end(), preempted), t.owners.end());
    if (t.state == TileState::Used) {
      ++taken;
      EXPECT_TRUE(reads_occupied) << "block " << b << " was taken by another sequence";
    } else {
      ++given_back;
      EXPECT_FALSE(reads_occupied) << "block " << b << " was given back but reads occupied";
    }
  }
  std::printf("step %d: seq %d held %d blocks: %d given back (not occupied), %d taken over\n",
              at->step, preempted, int(before->table.size()), given_back, taken);
  EXPECT_GE(given_back, 1) << "a preemption gives blocks back to the pool";
}

TEST_F(ServingCapture, ARecordedRunReplaysIntoTheSameCapture) {
  ServingSettings set;
  set.requests = 3;
  set.every = 1;
  set.max_tokens = 4;
  set.temperature = 0.0f;
  set.pool_blocks = 32;
  h.s.settings = set;
  h.s.run->start(serving_config(set, kShort), /*play=*/false);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvscope_serving_replay_" + std::to_string(::getpid()) + ".kvs"))
                               .string();
  std::unique_ptr<ServingRecorder> rec;
  std::shared_ptr<const ServingSnapshot> live3;
  for (int k = 1; k <= 5; ++k) {
    auto snap = step_to(*h.s.run, k);
    ASSERT_EQ(snap->step, k);
    if (k == 3) live3 = snap;
    if (!rec) {
      ServingMeta meta;
      meta.producer = "kvscope test";
      meta.model.file_name = std::filesystem::path(KVSCOPE_DEFAULT_MODEL).filename().string();
      auto r = ServingRecorder::create(path, meta, *snap);
      ASSERT_TRUE(r.ok()) << r.error().message;
      rec = std::move(r).value();
    } else {
      Status st = rec->append(*snap);
      ASSERT_TRUE(st.ok()) << st.message();
    }
  }
  ASSERT_TRUE(rec->finish().ok());
  h.s.run.reset();

  // The replayed step 3 reads as the live one.
  auto replay = ServingReplay::open(path);
  ASSERT_TRUE(replay.ok()) << replay.error().message;
  auto snap3 = replay.value()->snapshot(2);
  ASSERT_TRUE(snap3.ok()) << snap3.error().message;
  ASSERT_EQ(snap3.value()->step, 3);
  EXPECT_EQ(snap3.value()->history.back().used, live3->history.back().used);
  capture_checked(h, snap3.value());

  // The command line's replay: the snapshot at --steps 3, written as a PNG.
  CaptureOptions opts;
  opts.replay_path = path;
  opts.out_path = path + ".png";
  opts.steps = 3;
  opts.steps_given = true;
  opts.backend = "cpu";
  EXPECT_EQ(run_serving_screenshot(opts, set, /*panels=*/true), 0);
  EXPECT_TRUE(std::filesystem::exists(opts.out_path));
  EXPECT_GT(std::filesystem::file_size(opts.out_path), 1000u);
  std::filesystem::remove(opts.out_path);
  std::filesystem::remove(path);
}

}  // namespace
