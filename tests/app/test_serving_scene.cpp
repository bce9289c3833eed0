// test_serving_scene.cpp — the Serving view's scene from hand-built snapshots (no window,
// no engine):
//   - the pool: one tile per block, in block id order, at its grid place; free tiles grey,
//     used ones their owner's colour, shared ones striped, cached ones dim, the ones this
//     step wrote or copied flashing;
//   - the lanes: every token of every drawn lane, block boundaries, at most
//     kServingMaxLanes lanes (running, then waiting, then the most recent finished);
//   - the selected lane's block-table lines end at its tiles, one per logical block;
//   - blocks a preempted lane gave back fly from its lane into their tiles;
//   - the view: a tile's projected centre picks that tile, a token picks its lane and
//     position; the scene is rebuilt only when the snapshot or the options change; before
//     the first step the view is empty, with no write head;
//   - 16 sequences x 1,000 tokens: labels only where readable, markers per block.
#include <gtest/gtest.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include "app/scene/serving_scene.h"
#include "serving_snapshot_fixture.h"

namespace kvscope::app {
namespace {

using kvscope::test::serving_snapshot_eight;
using kvscope::test::serving_snapshot_large;

AnimClock settled() {
  AnimClock c;
  c.since_step = 5.0;
  return c;
}

ServingFrame frame_of(std::shared_ptr<const ServingSnapshot> s, ServingViewOptions v = {}) {
  ServingFrame f;
  f.snapshot = std::move(s);
  f.view = v;
  f.clock = settled();
  f.rect = {0, 0, 1280, 720};
  f.dt = 0;
  return f;
}

bool near(glm::vec3 a, glm::vec3 b, float eps = 1e-4f) {
  return glm::length(a - b) < eps;
}

TEST(ServingScene, BlocksAPreemptedLaneGaveBackFlyFromItsLaneIntoTheirTiles) {
  const ServingSnapshot before = serving_snapshot_eight();
  std::vector<int32_t> released;
  const ServingSnapshot after = kvscope::test::serving_preempted_after(before, 2, &released);
  ASSERT_GE(released.size(), 2u);
  const ServingGeometry g = serving_geometry(after);
  AnimClock now;
  now.since_step = 0.0;
  const render::Scene plain = build_serving_scene(after, {}, now);
  const render::Scene sc = build_serving_scene(after, {}, now, &before);
  const int lane = serving_lane_of(g, 2);
  ASSERT_GE(lane, 0);
  const Lane& was = before.lanes[2];
  // Every position seq 2 held in those blocks flies: from its slot in the lane (slide and
  // drop still to travel) to a slot inside its tile, in the order of the positions.
  size_t k = plain.tokens.size(), expected = 0;
  for (int32_t b : released) {  // in block id order, as the tiles are
    const int i = int(std::find(was.table.begin(), was.table.end(), b) - was.table.begin());
    const int first = i * 16, held = std::min(first + 16, was.computed);
    ASSERT_GT(held, first);
    expected += size_t(held - first);
    const glm::vec3 tile = g.tile_center(b);
    for (int p = first; p < held; ++p, ++k) {
      ASSERT_LT(k, sc.tokens.size());
      const render::TokenInstance& t = sc.tokens[k];
      const glm::vec3 start = t.position + glm::vec3(t.slide, t.drop, 0.0f);
      EXPECT_TRUE(near(start, g.token_center(lane, p))) << "block " << b << " position " << p;
      EXPECT_LT(std::abs(t.position.x - tile.x), 0.5f * g.tile_size) << "position " << p;
      EXPECT_LT(std::abs(t.position.y - tile.y), 0.5f * g.tile_size) << "position " << p;
      EXPECT_TRUE(near(t.color, serving_color(was.color)));
      EXPECT_EQ(t.leave, 1.0f) << "it shrinks into its tile as it lands";
      EXPECT_TRUE(t.label.empty());
    }
    // The page's 16 slots: a 4 x 4 grid, the first position top left, the second right of it.
    const render::TokenInstance& a = sc.tokens[k - size_t(held - first)];
    const render::TokenInstance& b2 = sc.tokens[k - size_t(held - first) + 1];
    EXPECT_NEAR(b2.position.x - a.position.x, g.tile_size / 4, 1e-4f);
    EXPECT_NEAR(b2.position.y, a.position.y, 1e-4f);
  }
  EXPECT_EQ(sc.tokens.size(), plain.tokens.size() + expected);
  // It travels in a straight line: x and y with one fraction, from 1 at the step to 0.
  EXPECT_EQ(sc.anim.slide, sc.anim.fall);
  EXPECT_EQ(sc.anim.fall, 1.0f);
  EXPECT_EQ(build_serving_scene(after, {}, settled(), &before).anim.fall, 0.0f);
  // Only from the step just before: a snapshot further back, or of another run, sends none.
  ServingSnapshot older = before;
  older.step -= 1;
  EXPECT_EQ(build_serving_scene(after, {}, now, &older).tokens.size(), plain.tokens.size());
  ServingSnapshot other = before;
  other.run += 1;
  EXPECT_EQ(build_serving_scene(after, {}, now, &other).tokens.size(), plain.tokens.size());
  // The view remembers the snapshot it drew before: stepping from one to the next flies them.
  ServingView view;
  view.update(frame_of(std::make_shared<const ServingSnapshot>(before)), {});
  ServingFrame f = frame_of(std::make_shared<const ServingSnapshot>(after));
  f.clock = now;
  view.update(f, {});
  size_t flying = 0;
  for (const auto& t : view.scene().tokens) flying += t.leave == 1.0f && t.label.empty() && t.drop > 0;
  EXPECT_EQ(flying, expected);
}

TEST(ServingScene, OneTilePerBlockInBlockOrderAtItsGridPlace) {
  const ServingSnapshot s = serving_snapshot_eight();
  const ServingGeometry g = serving_geometry(s);
  const render::Scene sc = build_serving_scene(s, {}, settled());
  ASSERT_EQ(sc.kv_blocks.size(), s.tiles.size());
  std::set<std::pair<int, int>> places;
  for (size_t b = 0; b < s.tiles.size(); ++b) {
    EXPECT_TRUE(near(sc.kv_blocks[b].position, g.tile_center(int(b)))) << "tile " << b;
    places.insert({int(std::lround(g.tile_center(int(b)).x * 10)),
                   int(std::lround(g.tile_center(int(b)).y * 10))});
    // Every tile inside the pool's bounds, under the lanes.
    const glm::vec3 c = g.tile_center(int(b));
    EXPECT_GE(c.x, g.pool_min.x);
    EXPECT_LE(c.x, g.pool_max.x);
    EXPECT_GE(c.y, g.pool_min.y);
    EXPECT_LE(c.y, g.pool_max.y);
  }
  EXPECT_EQ(places.size(), s.tiles.size()) << "two tiles at one place";
  EXPECT_LT(g.pool_max.y, g.lanes_min.y) << "the pool is under the lanes";
  // Pages: a tile is clearly bigger than a token.
  EXPECT_GT(sc.kv_block_size.x, 2.0f * sc.token_size.x);
  EXPECT_GT(sc.kv_block_size.y, 2.0f * sc.token_size.y);
  // Wider than tall.
  EXPECT_GT(g.pool_max.x - g.pool_min.x, g.pool_max.y - g.pool_min.y);
  // A flat wall: no floor, no depth haze dimming the far tiles of a long run.
  EXPECT_FALSE(sc.grid.visible);
  EXPECT_EQ(sc.haze, 0.0f);
  EXPECT_EQ(render::Scene{}.haze, 1.0f) << "the single-sequence view keeps its haze";
}

TEST(ServingScene, TileColoursSayFreeUsedSharedCachedAndWhatThisStepDid) {
  const ServingSnapshot s = serving_snapshot_eight();
  const render::Scene sc = build_serving_scene(s, {}, settled());
  int free = 0, used = 0, shared = 0, cached = 0, flashing = 0;
  for (size_t b = 0; b < s.tiles.size(); ++b) {
    const PoolTile& t = s.tiles[b];
    const render::KvBlockInstance& k = sc.kv_blocks[b];
    switch (t.state) {
      case TileState::Free:
        ++free;
        EXPECT_TRUE(near(k.color, serving_free_color())) << "free tile " << b;
        break;
      case TileState::Used:
        ++used;
        EXPECT_TRUE(near(k.color, serving_color(s.lanes[size_t(t.owners.front())].color)))
            << "used tile " << b << " is not its first owner's colour";
        EXPECT_GE(k.brightness, 0.75f);
        break;
      case TileState::Cached:
        ++cached;
        EXPECT_LE(k.brightness, 0.4f) << "cached tile " << b << " is not dim";
        EXPECT_FALSE(near(k.color, serving_free_color())) << "cached reads as free";
        break;
    }
    const bool is_shared = t.refs > 1;
    shared += is_shared;
    EXPECT_EQ(k.hatch_k > 0.0f, is_shared) << "tile " << b << " refs " << t.refs;
    EXPECT_EQ(k.hatch_v > 0.0f, t.refs > 2) << "tile " << b << " refs " << t.refs;
    if (t.flash == TileFlash::Written || t.flash == TileFlash::Cow) {
      ++flashing;
      EXPECT_GT(k.flash_brightness, 0.0f) << "tile " << b;
    }
    if (t.flash == TileFlash::Cow) {
      EXPECT_GT(k.flash_recompute, 0.0f);
    }
    if (t.flash == TileFlash::None) {
      EXPECT_EQ(k.flash_brightness, 0.0f);
      EXPECT_EQ(k.flash_recompute, 0.0f);
    }
  }
  // The fixture has each kind.
  EXPECT_GT(free, 0);
  EXPECT_GT(used, 0);
  EXPECT_GT(shared, 0);
  EXPECT_GT(cached, 0);
  EXPECT_GE(flashing, 6);
  // The flash plays right after the step and is over when settled.
  AnimClock now;
  now.since_step = 0.0;
  EXPECT_EQ(build_serving_scene(s, {}, now).anim.flash, 1.0f);
  EXPECT_LT(sc.anim.flash, 0.01f);
  // Sixteen distinct colours, none of them the free grey.
  for (int i = 0; i < 16; ++i) {
    EXPECT_FALSE(near(serving_color(i), serving_free_color(), 0.2f));
    for (int j = 0; j < i; ++j) EXPECT_FALSE(near(serving_color(i), serving_color(j), 0.15f));
  }
  EXPECT_TRUE(near(serving_color(3), serving_color(19)));
}

TEST(ServingScene, LanesHoldEveryTokenOfTheDrawnSequencesInLaneOrder) {
  const ServingSnapshot s = serving_snapshot_eight();
  const ServingGeometry g = serving_geometry(s);
  ASSERT_EQ(g.lane_seq.size(), s.lanes.size());
  const render::Scene sc = build_serving_scene(s, {}, settled());
  size_t i = 0;
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane& l = s.lanes[size_t(g.lane_seq[k])];
    EXPECT_EQ(serving_lane_of(g, l.seq), int(k));
    for (int pos = 0; pos < int(l.ids.size()); ++pos, ++i) {
      ASSERT_LT(i, sc.tokens.size());
      EXPECT_TRUE(near(sc.tokens[i].position, g.token_center(int(k), pos)));
    }
  }
  EXPECT_EQ(i, sc.tokens.size());
  // Labels: the lanes' pieces.
  EXPECT_NE(sc.tokens[0].label.find("sys0"), std::string::npos);
  ServingViewOptions no_labels;
  no_labels.labels = false;
  for (const auto& t : build_serving_scene(s, no_labels, settled()).tokens)
    EXPECT_TRUE(t.label.empty());
  // Prompt, cached prefix and generated tokens are told apart: seq 1 adopted 32 positions.
  const int lane1 = serving_lane_of(g, 1);
  size_t first1 = 0;
  for (int k = 0; k < lane1; ++k) first1 += s.lanes[size_t(g.lane_seq[size_t(k)])].ids.size();
  const Lane& l1 = s.lanes[1];
  const auto& cached_tok = sc.tokens[first1 + 5];
  const auto& prompt_tok = sc.tokens[first1 + size_t(l1.cached_tokens) + 2];
  const auto& gen_tok = sc.tokens[first1 + size_t(l1.prompt_tokens) + 2];
  EXPECT_FALSE(near(cached_tok.color, prompt_tok.color, 0.1f));
  EXPECT_FALSE(near(prompt_tok.color, gen_tok.color, 0.1f));
  EXPECT_TRUE(near(gen_tok.color, serving_color(l1.color)));
  EXPECT_GT(gen_tok.brightness, prompt_tok.brightness);
  // A waiting lane is dimmer than a running one; lanes are one row each, top first.
  const int lane6 = serving_lane_of(g, 6);
  size_t first6 = 0;
  for (int k = 0; k < lane6; ++k) first6 += s.lanes[size_t(g.lane_seq[size_t(k)])].ids.size();
  EXPECT_LT(sc.tokens[first6].brightness, 0.5f * prompt_tok.brightness + 0.2f);
  for (size_t k = 1; k < g.lane_seq.size(); ++k) EXPECT_LT(g.lane_y(int(k)), g.lane_y(int(k) - 1));
  // Block boundaries: one marker per boundary inside each lane, none per token.
  int boundaries = 0;
  for (int seq : g.lane_seq) boundaries += int(s.lanes[size_t(seq)].ids.size()) / s.block_size;
  int thin = 0;
  for (const auto& m : sc.markers) thin += m.size.x < 0.1f;
  EXPECT_EQ(thin, boundaries);
  // The sample (seq 4, forked off seq 3) has one branch bar, from lane 3 down to its own
  // lane, between the prompt's last position and its first sampled one.
  int branches = 0;
  for (const auto& m : sc.markers)
    if (std::abs(m.size.x - kServingBranchWidth) < 1e-6f) {
      ++branches;
      const app::Lane& l4 = s.lanes[4];
      EXPECT_NEAR(m.center.x, float(l4.prompt_tokens) - 0.5f, 1e-4f);
      EXPECT_NEAR(m.center.y, 0.5f * (g.lane_y(serving_lane_of(g, 3)) + g.lane_y(serving_lane_of(g, 4))), 1e-4f);
      EXPECT_TRUE(near(m.color, serving_color(l4.color)));
    }
  EXPECT_EQ(branches, 1);
  // Write heads: the scene's head on the first running lane, a marker on the four others.
  EXPECT_TRUE(sc.head.visible);
  EXPECT_TRUE(near(sc.head.position, g.token_center(0, int(s.lanes[0].ids.size()))));
  EXPECT_EQ(int(sc.markers.size()) - thin - branches, 4);
}

TEST(ServingScene, SelectedLaneDrawsOneLinePerLogicalBlockToItsTileAndItsAttention) {
  const ServingSnapshot s = serving_snapshot_eight();
  const ServingGeometry g = serving_geometry(s);
  for (int seq : {0, 3, 4}) {
    ServingViewOptions v;
    v.selected_seq = seq;
    const render::Scene sc = build_serving_scene(s, v, settled());
    const Lane& l = s.lanes[size_t(seq)];
    ASSERT_EQ(sc.beams.size(), l.table.size() + l.attention.size()) << "seq " << seq;
    const int lane = serving_lane_of(g, seq);
    for (size_t i = 0; i < l.table.size(); ++i) {
      const render::Beam& b = sc.beams[i];
      EXPECT_TRUE(near(b.to, g.tile_center(l.table[i]))) << "seq " << seq << " block " << i;
      EXPECT_TRUE(near(b.color, serving_color(l.color)));
      // From the middle of that block's tokens in the lane.
      const float x0 = g.token_center(lane, int(i) * s.block_size).x;
      EXPECT_GE(b.from.x, x0);
      EXPECT_LE(b.from.x, x0 + float(s.block_size) * kServingTokenPitch);
      EXPECT_NEAR(b.from.y, g.lane_y(lane), 1.0f);
    }
    // Attention beams leave the lane's write head.
    EXPECT_TRUE(near(sc.head.position, g.token_center(lane, int(l.ids.size()))));
    for (size_t j = l.table.size(); j < sc.beams.size(); ++j)
      EXPECT_TRUE(near(sc.beams[j].from, sc.head.position));
  }
  // A hovered lane adds its lines (no attention), the selected one stays.
  ServingViewOptions v;
  v.selected_seq = 0;
  v.hovered_seq = 2;
  const render::Scene sc = build_serving_scene(s, v, settled());
  EXPECT_EQ(sc.beams.size(),
            s.lanes[0].table.size() + s.lanes[0].attention.size() + s.lanes[2].table.size());
  // Nothing selected: no beams.
  EXPECT_TRUE(build_serving_scene(s, {}, settled()).beams.empty());
}

TEST(ServingScene, AHoveredTileIsLitAndSoAreItsPositionsInEveryLaneHoldingIt) {
  const ServingSnapshot s = serving_snapshot_eight();
  const ServingGeometry g = serving_geometry(s);
  ServingViewOptions v;
  v.hovered_tile = 1;  // the system prompt's second block: every admitted lane holds it
  const render::Scene sc = build_serving_scene(s, v, settled());
  for (size_t b = 0; b < sc.kv_blocks.size(); ++b)
    EXPECT_EQ(sc.kv_blocks[b].highlight > 0.0f, b == 1) << "tile " << b;
  size_t i = 0;
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane& l = s.lanes[size_t(g.lane_seq[k])];
    const bool holds = std::find(l.table.begin(), l.table.end(), 1) != l.table.end();
    for (int pos = 0; pos < int(l.ids.size()); ++pos, ++i)
      EXPECT_EQ(sc.tokens[i].highlighted, holds && pos >= 16 && pos < 32)
          << "seq " << l.seq << " pos " << pos;
  }
}

TEST(ServingScene, AtMost24LanesRunningFirstThenWaitingThenTheMostRecentFinished) {
  ServingSnapshot s;
  s.block_size = 16;
  s.n_blocks = 64;
  s.tiles.resize(64);
  s.n_requests = 45;
  for (int i = 0; i < 45; ++i) {
    LaneState st = LaneState::Finished;
    if (i == 40 || i == 42 || i == 44) st = LaneState::Running;
    if (i == 41 || i == 43) st = LaneState::Waiting;
    s.lanes.push_back(test::serving_lane(i, i, st, 8, 4));
  }
  s.waiting = {43, 41};
  const ServingGeometry g = serving_geometry(s);
  ASSERT_EQ(int(g.lane_seq.size()), kServingMaxLanes);
  std::set<int> drawn(g.lane_seq.begin(), g.lane_seq.end());
  for (int seq : {40, 41, 42, 43, 44}) EXPECT_TRUE(drawn.count(seq)) << seq;
  // The 19 finished ones drawn are the most recent: 21..39.
  for (int seq = 21; seq < 40; ++seq) EXPECT_TRUE(drawn.count(seq)) << seq;
  EXPECT_FALSE(drawn.count(20));
  // Drawn in id order (a lane keeps its row as its sequence changes state).
  EXPECT_TRUE(std::is_sorted(g.lane_seq.begin(), g.lane_seq.end()));
  size_t tokens = 0;
  for (int seq : g.lane_seq) tokens += s.lanes[size_t(seq)].ids.size();
  EXPECT_EQ(build_serving_scene(s, {}, settled()).tokens.size(), tokens);
}

TEST(ServingView, PickingAProjectedTileCentreReturnsThatTileAndATokenItsLane) {
  auto s = std::make_shared<const ServingSnapshot>(serving_snapshot_eight());
  ServingView view;
  ServingFrame f = frame_of(s);
  view.update(f, {});
  const ServingGeometry& g = view.geometry();
  for (int b : {0, 1, 5, 17, 40, 95}) {
    glm::vec2 p;
    ASSERT_TRUE(view.project(g.tile_center(b), &p)) << "tile " << b << " is outside the view";
    ViewInput in;
    in.hover = true;
    in.mouse_x = p.x;
    in.mouse_y = p.y;
    view.update(f, in);
    EXPECT_EQ(view.picked().tile, b);
    EXPECT_EQ(view.picked().seq, -1);
  }
  for (int lane : {0, 3, 7}) {
    glm::vec2 p;
    ASSERT_TRUE(view.project(g.token_center(lane, 9), &p));
    ViewInput in;
    in.hover = true;
    in.mouse_x = p.x;
    in.mouse_y = p.y;
    view.update(f, in);
    EXPECT_EQ(view.picked().seq, g.lane_seq[size_t(lane)]);
    EXPECT_EQ(view.picked().pos, 9);
    EXPECT_EQ(view.picked().tile, -1);
  }
  // Everything framed inside the rectangle.
  glm::vec2 p;
  EXPECT_TRUE(view.project(g.pool_min, &p));
  EXPECT_TRUE(view.project(g.pool_max, &p));
  EXPECT_TRUE(view.project(g.lanes_max, &p));
  EXPECT_TRUE(view.project({g.lanes_min.x, g.lane_y(0), 0}, &p));
}

TEST(ServingView, RebuildsOnlyWhenTheSnapshotOrTheOptionsChange) {
  auto s = std::make_shared<const ServingSnapshot>(serving_snapshot_eight());
  ServingView view;
  ServingFrame f = frame_of(s);
  view.update(f, {});
  const uint64_t rev = view.scene().revision;
  view.update(f, {});
  EXPECT_EQ(view.scene().revision, rev);
  f.view.selected_seq = 2;
  view.update(f, {});
  EXPECT_NE(view.scene().revision, rev);
  const uint64_t rev2 = view.scene().revision;
  f.snapshot = std::make_shared<const ServingSnapshot>(*s);
  view.update(f, {});
  EXPECT_NE(view.scene().revision, rev2);
  EXPECT_FALSE(view.scene().beams.empty());
}

TEST(ServingView, BeforeTheFirstStepNothingIsDrawnAndNoWriteHeadGlows) {
  ServingView view;
  view.update(frame_of(nullptr), {});
  const render::Scene& sc = view.scene();
  EXPECT_FALSE(sc.head.visible);
  EXPECT_TRUE(sc.tokens.empty());
  EXPECT_TRUE(sc.kv_blocks.empty());
  EXPECT_TRUE(sc.beams.empty());
  // Once a run is under way, its running lane's head is drawn again.
  view.update(frame_of(std::make_shared<const ServingSnapshot>(serving_snapshot_eight())), {});
  EXPECT_TRUE(view.scene().head.visible);
}

TEST(ServingView, SixteenLanesOfAThousandTokensStayLight) {
  auto s = std::make_shared<const ServingSnapshot>(serving_snapshot_large(16, 1000));
  ServingView view;
  const auto t0 = std::chrono::steady_clock::now();
  view.update(frame_of(s), {});
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const render::Scene& sc = view.scene();
  // Framed whole, the lanes' tokens are under kServingBarSpacingPx apart: each lane is
  // drawn as a few bars (its prompt, its generated part), not 1,000 blocks.
  EXPECT_EQ(sc.tokens.size(), 0u);
  EXPECT_EQ(sc.kv_blocks.size(), s->tiles.size());
  EXPECT_EQ(build_serving_scene(*s, {}, settled()).tokens.size(), size_t(16 * 1000));
  // The attention beams of a selected 1,000-token lane: the strongest kServingMaxBeams.
  ServingViewOptions sel;
  sel.selected_seq = 2;
  EXPECT_LE(build_serving_scene(*s, sel, settled()).beams.size(),
            s->lanes[2].table.size() + size_t(kServingMaxBeams));
  // Framed whole, no token is far enough from its neighbour to read: no labels at all.
  size_t labels = 0;
  for (const auto& t : sc.tokens) labels += !t.label.empty();
  EXPECT_EQ(labels, 0u);
  EXPECT_LT(sc.markers.size(), size_t(16 * 1000 / 8));
  std::printf("16 x 1,000 tokens: the view built in %.1f ms\n", ms);  // measured, not asserted
  // Zoomed in on the start of the first lane, its tokens there get labels, few in all.
  ViewInput in;
  in.hover = true;
  glm::vec2 p;
  ASSERT_TRUE(view.project(view.geometry().token_center(0, 10), &p));
  in.mouse_x = p.x;
  in.mouse_y = p.y;
  in.wheel = 30;
  ServingFrame f = frame_of(s);
  view.update(f, in);
  labels = 0;
  for (const auto& t : view.scene().tokens) {
    if (t.label.empty()) continue;
    ++labels;
    // Only tokens in view get one.
    const render::Viewport vp{0, 0, 1280, 720};
    auto at = render::project_to_viewport(view.scene().camera, t.position, vp);
    ASSERT_TRUE(at);
    EXPECT_GT(at->x, -30.0f);
    EXPECT_LT(at->x, 1310.0f);
  }
  EXPECT_GT(labels, 0u);
  EXPECT_LT(view.scene().tokens.size(), size_t(16 * 200)) << "tokens out of view are drawn";
}

}  // namespace
// Speculative decoding: the drafts the target rejected are ghosts over the slots they were
// drafted for (the first over the target's own token), sinking away as the step's animation
// runs; the kept drafts and the target's token drop into their slots; the window's view
// draws the ghosts whatever its level of detail.
TEST(ServingScene, RejectedDraftsAreGhostsThatSinkAwayAndKeptOnesDropIn) {
  ServingSnapshot s = serving_snapshot_eight();
  Lane* l = nullptr;
  for (Lane& x : s.lanes)
    if (x.state == LaneState::Running && x.ids.size() > size_t(x.prompt_tokens) + 3) l = &x;
  ASSERT_NE(l, nullptr);
  l->drafted = {" alpha", " beta", " gamma", " delta"};
  l->accepted = 1;  // " alpha" kept; then the target's own token; " gamma", " delta" dropped
  l->step_tokens = 5;
  const ServingGeometry g = serving_geometry(s);
  const int lane = serving_lane_of(g, l->seq);
  ASSERT_GE(lane, 0);
  const int n = int(l->ids.size());
  AnimClock now;
  now.since_step = 0.0;
  const render::Scene sc = build_serving_scene(s, {}, now);
  size_t lane_tokens = 0;
  for (int seq : g.lane_seq)
    for (const Lane& x : s.lanes)
      if (x.seq == seq) lane_tokens += x.ids.size();
  ASSERT_EQ(sc.tokens.size(), lane_tokens + 3);  // three rejected: beta, gamma, delta
  for (int j = 0; j < 3; ++j) {
    const render::TokenInstance& t = sc.tokens[lane_tokens + size_t(j)];
    EXPECT_EQ(t.leave, 1.0f);
    EXPECT_TRUE(near(t.position, g.token_center(lane, n - 1 + j) +
                                     glm::vec3(0.0f, kServingGhostRise, 0.0f)));
  }
  EXPECT_NE(sc.tokens[lane_tokens].label.find("beta"), std::string::npos);
  EXPECT_LT(sc.anim.leave, 0.05f);  // at the step: still there
  EXPECT_EQ(build_serving_scene(s, {}, settled()).anim.leave, 1.0f);  // then gone
  // The kept draft (n - 2) and the target's token (n - 1) drop in; the one before does not.
  size_t first = 0;
  for (int k = 0; k < lane; ++k)
    for (const Lane& x : s.lanes)
      if (x.seq == g.lane_seq[size_t(k)]) first += x.ids.size();
  EXPECT_GT(sc.tokens[first + size_t(n - 2)].drop, 0.0f);
  EXPECT_GT(sc.tokens[first + size_t(n - 1)].drop, 0.0f);
  EXPECT_EQ(sc.tokens[first + size_t(n - 3)].drop, 0.0f);
  // The window's view keeps the ghosts.
  ServingView view;
  ServingFrame f = frame_of(std::make_shared<const ServingSnapshot>(s));
  view.update(f, {});
  int ghosts = 0;
  for (const auto& t : view.scene().tokens) ghosts += t.leave == 1.0f;
  EXPECT_EQ(ghosts, 3);
  // Nothing drafted: no ghost.
  l->drafted.clear();
  EXPECT_EQ(build_serving_scene(s, {}, now).tokens.size(), lane_tokens);
}

}  // namespace kvscope::app
