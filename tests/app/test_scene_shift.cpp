// test_scene_shift.cpp — a context shift as the scene draws it, from hand-built step
// results (no window, no model): 2 layers, one KV head, context 10, n_keep 2. Steps 1-4 fill
// the context; step 5 drops positions [2, 6) and moves 6..9 down to 2..5 (shift_n 4).
// Asserts, as pure functions of the step results and the time since step 5 arrived:
//   - the timeline renumbers: position 2 after the shift is the token that stood at 6;
//   - the survivors' drawn centers (the block shader's rule, render::drawn_center) start at
//     their old positions and end at their new ones, moving monotonically in between; the
//     kept positions never move; the dropped positions' tokens and blocks are drawn where
//     they stood and are gone (fully left) at the end;
//   - looking back at step 4 shows the sequence before the shift, unmoved.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "app/core/timeline.h"
#include "app/scene/scene_builder.h"
#include "app/scene/scene_shift.h"
#include "tests/render/expected_layout.h"

namespace kvscope::app {
namespace {

namespace layout = kvscope::test::expected_layout;
constexpr int kL = 2, kPrompt = 6, kCtx = 10, kKeep = 2, kDrop = 4;

// The K norm written for the token that arrived `index`-th (distinct per token and layer).
float norm_of(int index, int layer) {
  return 1.0f + 0.01f * float(index) + 0.5f * float(layer);
}

std::shared_ptr<StepTrace> step_trace(int step, int pos, int first, int written, int held,
                                      int arrival_first) {
  auto t = std::make_shared<StepTrace>();
  t->step = step;
  t->pos = pos;
  t->token_id = 100 + step;
  t->text = " g" + std::to_string(step);
  t->n_layer = kL;
  t->n_head = 2;
  t->n_attn = pos;
  t->attention.assign(size_t(kL) * 2 * size_t(pos), 1.0f / float(pos));
  t->kv_first_pos = first;
  t->kv_written = written;
  for (int l = 0; l < kL; ++l)
    for (int i = 0; i < written; ++i) t->k_norm.push_back(norm_of(arrival_first + i, l));
  t->v_norm = t->k_norm;
  t->kv_layers.resize(size_t(kL));
  for (auto& ks : t->kv_layers) ks.held = {{0, held}};
  t->seq_len = pos + 1;
  return t;
}

Timeline shifted_run() {
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  reset.prompt_text = "shift";
  tl.apply(reset);
  auto apply = [&](std::shared_ptr<StepTrace> t) {
    Event e{Event::Kind::Step, 1};
    e.trace = std::move(t);
    tl.apply(e);
  };
  auto t1 = step_trace(1, kPrompt, 0, kPrompt, kPrompt, 0);  // prefill 0..5, writes 6
  for (int i = 0; i < kPrompt; ++i) t1->prompt.push_back({i, " p" + std::to_string(i)});
  apply(t1);
  for (int s = 2; s <= 4; ++s)  // write 7, 8, 9: the context (10) is full
    apply(step_trace(s, kPrompt + s - 1, kPrompt + s - 2, 1, kPrompt + s - 1, kPrompt + s - 2));
  // Step 5 drops [2, 6): the cache held 0..8 (9 rows), now 0..4, and computes the row of
  // the token that arrived 9th (at position 9, now 5); it writes position 6.
  auto t5 = step_trace(5, kCtx - kDrop, kCtx - 1 - kDrop, 1, kCtx - kDrop, kCtx - 1);
  t5->shift_first = kKeep;
  t5->shift_n = kDrop;
  t5->shifted_total = kDrop;
  apply(t5);
  return tl;
}

ViewOptions view() {
  ViewOptions v;
  v.layer = 0;
  v.n_head_kv = 1;
  return v;
}

AnimClock at(double since) {
  AnimClock c;
  c.since_step = since;
  return c;
}

// Drawn x of the live (not leaving) KV block of `pos`, layer `layer`; NaN when absent.
float kv_x(const render::Scene& s, int pos, int layer) {
  const float y = layout::kv_block_position(pos, layer).y;
  for (const auto& k : s.kv_blocks)
    if (k.leave == 0.0f && std::abs(k.position.y - y) < 1e-4f &&
        std::abs(k.position.x - float(pos) * layout::kTokenSpacing) < 1e-4f)
      return render::drawn_center(k, s.anim).x;
  return NAN;
}

TEST(SceneShift, TimelineRenumbersPositionsAfterTheShift) {
  Timeline tl = shifted_run();
  ASSERT_EQ(tl.viewed_seq_len(), 7);
  EXPECT_EQ(tl.token_at(1)->id, 1);  // kept
  EXPECT_EQ(tl.token_at(2)->step, 1) << "position 2 is now the token that stood at 6";
  EXPECT_EQ(tl.token_at(5)->step, 4) << "position 5 is now the token that stood at 9";
  EXPECT_EQ(tl.token_at(6)->step, 5) << "the token step 5 wrote";
  EXPECT_EQ(tl.token_at(7), nullptr);
  EXPECT_FLOAT_EQ(tl.kv_norm(2, 1, false), norm_of(6, 1)) << "its K row's norm moves with it";
  EXPECT_FLOAT_EQ(tl.kv_norm(5, 0, false), norm_of(9, 0)) << "written by step 5";
  EXPECT_EQ(int(tl.tokens().size()), 11) << "the transcript keeps the dropped tokens";

  // The transcript keeps every token: its entries map back to the positions they hold now.
  EXPECT_EQ(tl.position_of_index(1), 1);
  EXPECT_EQ(tl.position_of_index(3), -1) << "dropped";
  EXPECT_EQ(tl.position_of_index(6), 2);
  EXPECT_EQ(tl.position_of_index(10), 6);
  for (int p = 0; p < 7; ++p) EXPECT_EQ(tl.position_of_index(tl.token_index(p)), p);

  tl.scrub_to(4);  // before the shift: the old numbering
  EXPECT_EQ(tl.token_at(2)->id, 2);
  EXPECT_EQ(tl.token_at(9)->step, 4);
  EXPECT_FLOAT_EQ(tl.kv_norm(2, 0, false), norm_of(2, 0));
  EXPECT_EQ(tl.position_of_index(3), 3);
  EXPECT_EQ(tl.position_of_index(10), -1) << "not sampled yet at step 4";
}

TEST(SceneShift, SurvivorsStartAtTheirOldPositionsAndEndAtTheNewOnes) {
  const Timeline tl = shifted_run();
  const render::Scene s0 = build_scene(tl, view(), at(0.0));
  const render::Scene mid =
      build_scene(tl, view(), at(kShiftSlideDelay + 0.5 * kShiftSlideSeconds));
  const render::Scene end = build_scene(tl, view(), at(kShiftSlideDelay + kShiftSlideSeconds));
  ASSERT_GE(s0.tokens.size(), 7u);
  for (int p = 0; p < 7; ++p) {
    const float now = float(p) * layout::kTokenSpacing;
    const float old = float(p < kKeep ? p : p + kDrop) * layout::kTokenSpacing;
    EXPECT_FLOAT_EQ(render::drawn_center(s0.tokens[size_t(p)], s0.anim).x, old) << "token " << p;
    EXPECT_FLOAT_EQ(render::drawn_center(end.tokens[size_t(p)], end.anim).x, now) << "token " << p;
    const float m = render::drawn_center(mid.tokens[size_t(p)], mid.anim).x;
    if (p < kKeep) {
      EXPECT_FLOAT_EQ(m, now) << "kept positions stay put";
    } else {
      EXPECT_GT(m, now) << "token " << p;
      EXPECT_LT(m, old) << "token " << p;
    }
    if (p == 6) continue;  // the newest token's K/V row is not computed yet
    for (int l = 0; l < kL; ++l) {
      EXPECT_FLOAT_EQ(kv_x(s0, p, l), old) << "block " << p << " layer " << l;
      EXPECT_FLOAT_EQ(kv_x(end, p, l), now) << "block " << p << " layer " << l;
    }
  }
  EXPECT_FLOAT_EQ(s0.anim.slide, 1.0f);
  EXPECT_FLOAT_EQ(end.anim.slide, 0.0f);
  // The write head travels with the newest token (it starts over the end of the old
  // sequence, and moves one slot on as the token lands); the beams wait for the slide.
  EXPECT_FLOAT_EQ(s0.head.position.x, layout::head_position(6 + kDrop).x);
  EXPECT_FLOAT_EQ(end.head.position.x, layout::head_position(7).x);
  EXPECT_FLOAT_EQ(s0.anim.beam_fade, 0.0f);
  EXPECT_GT(end.anim.beam_fade, 0.5f);
}

TEST(SceneShift, DroppedPositionsLeaveWhereTheyStood) {
  const Timeline tl = shifted_run();
  const render::Scene s0 = build_scene(tl, view(), at(0.0));
  const render::Scene end = build_scene(tl, view(), at(2.0));
  int ghost_tokens = 0, ghost_blocks = 0;
  for (size_t i = 7; i < s0.tokens.size(); ++i) {
    const auto& t = s0.tokens[i];
    EXPECT_EQ(t.leave, 1.0f);
    EXPECT_TRUE(t.label.empty());
    EXPECT_EQ(t.slide, 0.0f);
    const int p = int(std::lround(t.position.x / layout::kTokenSpacing));
    EXPECT_GE(p, kKeep);
    EXPECT_LT(p, kKeep + kDrop);
    EXPECT_FLOAT_EQ(render::drawn_center(t, s0.anim).y, t.position.y) << "whole at the start";
    ++ghost_tokens;
  }
  for (const auto& k : s0.kv_blocks)
    if (k.leave == 1.0f) {
      const int p = int(std::lround(k.position.x / layout::kTokenSpacing));
      EXPECT_GE(p, kKeep);
      EXPECT_LT(p, kKeep + kDrop);
      ++ghost_blocks;
    }
  EXPECT_EQ(ghost_tokens, kDrop);
  EXPECT_EQ(ghost_blocks, kDrop * kL);
  EXPECT_FLOAT_EQ(s0.anim.leave, 0.0f);
  EXPECT_FLOAT_EQ(end.anim.leave, 1.0f) << "gone (shrunk to nothing) at the end";
}

TEST(SceneShift, TheStepBeforeTheShiftDoesNotMove) {
  Timeline tl = shifted_run();
  tl.scrub_to(4);
  const render::Scene s = build_scene(tl, view(), at(0.0));
  EXPECT_EQ(s.tokens.size(), 10u) << "no dropped tokens drawn";
  for (const auto& t : s.tokens) EXPECT_EQ(t.slide, 0.0f);
  for (const auto& k : s.kv_blocks) EXPECT_EQ(k.slide, 0.0f);
  EXPECT_EQ(s.anim.slide, 0.0f);
}

TEST(SceneShift, HeldRangesRenumberAcrossTheShift) {
  using R = std::vector<KvRange>;
  auto eq = [](const R& a, const R& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].begin != b[i].begin || a[i].end != b[i].end) return false;
    return true;
  };
  EXPECT_TRUE(eq(ranges_after_shift({{0, 9}}, 2, 4), R{{0, 5}}));
  EXPECT_TRUE(eq(ranges_after_shift({{0, 2}, {7, 9}}, 2, 4), R{{0, 2}, {3, 5}}));
  EXPECT_TRUE(eq(ranges_after_shift({{3, 5}}, 2, 4), R{}));
}

}  // namespace
}  // namespace kvscope::app
