// serving_scene.cpp — a serving snapshot as geometry: the lanes of tokens (prompt, cached
// prefix and generated parts told apart, block boundaries marked), the pool's tiles (owner
// colour, stripes when shared, grey when free, dim when only cached, flashing when this
// step touched them), the block-table lines and attention beams of the selected lane, and
// the write heads of the running lanes.
//
// Only the plain data of serving_run.h is read here (no function of the run's own).
#include "app/scene/serving_scene.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "app/scene/easing.h"
#include "render/glyph_atlas.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

glm::vec3 serving_color(int i) {
  // Sixteen hues far enough apart to tell sixteen sequences apart, and none of them grey.
  static const glm::vec3 kPalette[16] = {
      {1.00f, 0.46f, 0.30f}, {0.32f, 0.66f, 1.00f}, {0.42f, 0.90f, 0.38f}, {1.00f, 0.82f, 0.22f},
      {0.78f, 0.46f, 1.00f}, {0.25f, 0.90f, 0.86f}, {1.00f, 0.42f, 0.70f}, {0.72f, 0.88f, 0.25f},
      {0.55f, 0.55f, 1.00f}, {1.00f, 0.62f, 0.16f}, {0.36f, 0.80f, 0.60f}, {0.92f, 0.30f, 0.36f},
      {0.58f, 0.82f, 1.00f}, {0.96f, 0.60f, 0.96f}, {0.80f, 0.66f, 0.42f}, {0.55f, 1.00f, 0.72f}};
  const int n = int(std::size(kPalette));
  return kPalette[((i % n) + n) % n];
}

glm::vec3 serving_free_color() {
  return {0.34f, 0.36f, 0.41f};
}

glm::vec3 serving_cached_color(int i) {
  // The owner's hue, washed toward the free grey: "still holds that prefix, nobody reads it";
  // a dull teal when the owner is not known (the cache keeps blocks nobody holds).
  if (i < 0) return {0.30f, 0.62f, 0.62f};
  return glm::mix(serving_color(i), serving_free_color(), 0.3f);
}

namespace {

bool lane_ended(LaneState st) {
  return st == LaneState::Finished || st == LaneState::Cancelled || st == LaneState::Failed;
}

// Up to kServingMaxLanes sequences: the running ones, then the waiting queue, then the
// others still alive, then the most recent ended ones (of pruned beams, the newest
// kServingPrunedLanes); drawn by request, then sequence id,
// so a lane keeps its row while its sequence goes from waiting to running to finished and
// a request's forks (samples, beams) sit under it.
std::vector<int> choose_lanes(const ServingSnapshot& s) {
  std::vector<int> chosen;
  auto take = [&](int seq) {
    if (int(chosen.size()) >= kServingMaxLanes || !s.lane(seq)) return;
    if (std::find(chosen.begin(), chosen.end(), seq) == chosen.end()) chosen.push_back(seq);
  };
  for (const Lane& l : s.lanes)
    if (l.state == LaneState::Running) take(l.seq);
  for (int seq : s.waiting) take(seq);
  for (const Lane& l : s.lanes)
    if (!lane_ended(l.state)) take(l.seq);
  // Of the beams pruned (a beam search drops many), only the newest few.
  int pruned_shown = 0;
  for (auto it = s.lanes.rbegin(); it != s.lanes.rend(); ++it) {
    if (!lane_ended(it->state)) continue;
    if (it->stop == "pruned" && pruned_shown++ >= kServingPrunedLanes) continue;
    take(it->seq);
  }
  std::sort(chosen.begin(), chosen.end(), [&](int a, int b) {
    const int ra = s.lane(a)->request, rb = s.lane(b)->request;
    return ra != rb ? ra < rb : a < b;
  });
  return chosen;
}

}  // namespace

float ServingGeometry::lane_y(int lane) const {
  return -float(lane) * kServingLanePitch;
}

glm::vec3 ServingGeometry::token_center(int lane, int pos) const {
  return {float(pos) * kServingTokenPitch, lane_y(lane), 0.0f};
}

glm::vec3 ServingGeometry::tile_center(int block) const {
  const int c = std::max(columns, 1);
  const int col = block % c, row = block / c;
  return {0.5f * tile_size + float(col) * tile_pitch, pool_top - float(row) * tile_pitch, 0.0f};
}

int serving_lane_of(const ServingGeometry& g, int seq) {
  for (size_t k = 0; k < g.lane_seq.size(); ++k)
    if (g.lane_seq[k] == seq) return int(k);
  return -1;
}

ServingGeometry serving_geometry(const ServingSnapshot& s) {
  ServingGeometry g;
  g.block_size = std::max(s.block_size, 1);
  g.lane_seq = choose_lanes(s);
  const int n_blocks = std::max(int(s.tiles.size()), s.n_blocks);
  // About three times as wide as tall: under the lanes, the whole fits a 16:9 view.
  g.columns = std::max(8, int(std::ceil(std::sqrt(3.0 * std::max(n_blocks, 1)))));
  const int rows = (std::max(n_blocks, 1) + g.columns - 1) / g.columns;
  int longest = 1;
  for (int seq : g.lane_seq)
    if (const Lane* l = s.lane(seq)) longest = std::max(longest, int(l->ids.size()) + 1);
  // The pool's scale: grown by steps of sqrt(2) until it spans 70% of the longest lane.
  const float lanes_w = float(longest) * kServingTokenPitch;
  while (float(g.columns) * g.tile_pitch < 0.7f * lanes_w) g.tile_pitch *= 1.41421356f;
  g.tile_size = g.tile_pitch * kServingTileFill;
  // Rows for every request's lane from the start, so the pool does not move down as they
  // arrive (only when more lanes than requests appear, as parallel samples fork).
  const int lanes_reserved =
      std::max<int>(int(g.lane_seq.size()), std::min(kServingMaxLanes, std::max(s.n_requests, 1)));
  const float half_tok = 0.5f * kServingTokenPitch;
  const float half_tile = 0.5f * g.tile_size;
  g.pool_top = g.lane_y(lanes_reserved - 1) - half_tok - kServingPoolGap - half_tile;
  g.pool_min = {0.0f, g.pool_top - float(rows - 1) * g.tile_pitch - half_tile, -half_tile};
  g.pool_max = {float(g.columns - 1) * g.tile_pitch + g.tile_size, g.pool_top + half_tile,
                half_tile};
  g.lanes_min = {-half_tok, g.lane_y(std::max(lanes_reserved, 1) - 1) - half_tok, -half_tok};
  g.lanes_max = {float(longest - 1) * kServingTokenPitch + half_tok, g.lane_y(0) + half_tok,
                 half_tok};
  return g;
}

namespace {

constexpr float kTokenSize = 0.72f;
constexpr float kTileDepth = 0.3f;
constexpr float kHatch = 2.9f;  // stripes per tile width on a shared tile
constexpr int kLabelChars = 7;  // a lane's labels are cut to this many characters

// How a lane's state dims its tokens: waiting ones have computed nothing yet, finished
// ones are done, preempted ones lost their cache (grey, see lane_token).
float lane_brightness(LaneState st) {
  switch (st) {
    case LaneState::Running:
      return 1.0f;
    case LaneState::Waiting:
      return 0.45f;
    case LaneState::Preempted:
      return 0.55f;
    case LaneState::Finished:
      return 0.6f;
    case LaneState::Cancelled:
    case LaneState::Failed:
      return 0.45f;
  }
  return 1.0f;
}

// A pruned beam fades: its blocks went back to the pool, nothing continues it.
bool pruned(const Lane& l) { return lane_ended(l.state) && l.stop == "pruned"; }

std::string short_label(const std::string& piece) {
  std::string text = display_text(piece), out;
  int n = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    (void)render::next_codepoint(text, &i);
    if (++n > kLabelChars) {
      out += "\xE2\x80\xA6";  // …
      break;
    }
    out.append(text, at, i - at);
  }
  return out;
}

// One token of a lane: generated in the lane's full colour, the computed prompt in a muted
// version of it, the prefix adopted from the cache pale (washed toward white), positions
// not computed yet (waiting, chunked prefill) dark.
render::TokenInstance lane_token(const Lane& l, int pos, glm::vec3 at) {
  render::TokenInstance t;
  t.position = at;
  const glm::vec3 hue = serving_color(l.color);
  const bool grey = l.state == LaneState::Preempted || l.state == LaneState::Cancelled ||
                    l.state == LaneState::Failed;
  float b = 1.0f;
  if (pos < l.cached_tokens && pos < l.prompt_tokens) {
    t.color = glm::mix(hue, glm::vec3(1.0f), 0.6f);
    b = 0.8f;
  } else if (pos < l.prompt_tokens) {
    t.color = glm::mix(hue, glm::vec3(0.45f, 0.5f, 0.6f), 0.55f);
    b = 0.62f;
  } else {
    t.color = hue;
  }
  if (grey) t.color = glm::vec3(0.5f, 0.52f, 0.56f);
  if (l.state == LaneState::Running && pos >= l.computed) b *= 0.45f;  // not computed yet
  t.brightness = b * lane_brightness(l.state) * (pruned(l) ? 0.45f : 1.0f);
  return t;
}

}  // namespace

int serving_fork_stem(const ServingSnapshot& s, const Lane& l) {
  if (l.parent < 0) return 0;
  if (l.sample > 0) return l.prompt_tokens;  // a sample forks when its prompt is computed
  const Lane* p = s.lane(l.parent);
  if (!p) return l.prompt_tokens;
  size_t n = 0;
  while (n < l.ids.size() && n < p->ids.size() && l.ids[n] == p->ids[n]) ++n;
  return std::max(int(n), l.prompt_tokens);
}

namespace {

// A fork's branch: an upright bar in its colour from its parent's lane down (or up) to its
// own, between the last token they share and its first own one.
void add_branches(render::Scene* s, const ServingSnapshot& snap, const ServingGeometry& g) {
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane& l = *snap.lane(g.lane_seq[k]);
    const int parent_lane = l.parent >= 0 ? serving_lane_of(g, l.parent) : -1;
    if (parent_lane < 0) continue;
    const int stem = serving_fork_stem(snap, l);
    const float y0 = g.lane_y(parent_lane), y1 = g.lane_y(int(k));
    render::MarkerInstance m;
    m.center = {(float(stem) - 0.5f) * kServingTokenPitch, 0.5f * (y0 + y1), 0.0f};
    m.size = {kServingBranchWidth, std::abs(y1 - y0) + 0.3f * kTokenSize, 0.3f * kTokenSize};
    m.color = serving_color(l.color) * (lane_ended(l.state) ? (pruned(l) ? 0.35f : 0.6f) : 1.0f);
    s->markers.push_back(m);
  }
}

// The drafted tokens the target rejected this step: ghosts (pale, outlined) floating over
// the slots they were drafted for — the first where the target's own token now stands —
// that sink away as the step's animation runs (SceneAnim::leave), as their K/V rows left
// the pool. Appended after every lane's tokens (ServingView draws them whatever the level
// of detail).
void add_ghosts(render::Scene* s, const ServingSnapshot& snap, const ServingGeometry& g) {
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane& l = *snap.lane(g.lane_seq[k]);
    if (l.drafted.empty() || l.accepted >= int(l.drafted.size())) continue;
    const int first = int(l.ids.size()) - 1;  // the slot of the first rejected draft
    for (size_t j = size_t(l.accepted); j < l.drafted.size(); ++j) {
      const int pos = first + int(j) - l.accepted;
      render::TokenInstance t;
      t.position = g.token_center(int(k), pos) + glm::vec3(0.0f, kServingGhostRise, 0.0f);
      t.color = glm::mix(serving_color(l.color), glm::vec3(1.0f), 0.7f);
      t.brightness = 0.55f;
      t.highlighted = true;
      t.leave = 1.0f;
      t.label = short_label(l.drafted[j]);
      s->tokens.push_back(std::move(t));
    }
  }
}

void add_lanes(render::Scene* s, const ServingSnapshot& snap, const ServingGeometry& g,
               const ServingViewOptions& opts) {
  const int bs = g.block_size;
  const PoolTile* hovered = opts.hovered_tile >= 0 && size_t(opts.hovered_tile) < snap.tiles.size()
                                ? &snap.tiles[size_t(opts.hovered_tile)]
                                : nullptr;
  size_t total = 0;
  for (int seq : g.lane_seq) total += snap.lane(seq)->ids.size();
  s->tokens.reserve(total);
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane& l = *snap.lane(g.lane_seq[k]);
    const int n = int(l.ids.size());
    // The hovered tile's positions in this lane, when the lane's table holds it.
    int lit0 = -1, lit1 = -1;
    if (hovered)
      for (size_t i = 0; i < l.table.size(); ++i)
        if (l.table[i] == opts.hovered_tile) {
          lit0 = int(i) * bs;
          lit1 = lit0 + bs;
        }
    // A beam's stem past the prompt is its parent's tokens (the blocks they share): faint
    // here, drawn in full on the lanes that wrote them.
    const int stem = l.parent >= 0 && l.sample == 0 && serving_lane_of(g, l.parent) >= 0
                         ? serving_fork_stem(snap, l)
                         : 0;
    for (int pos = 0; pos < n; ++pos) {
      render::TokenInstance t = lane_token(l, pos, g.token_center(int(k), pos));
      if (pos >= l.prompt_tokens && pos < stem) t.brightness *= 0.3f;
      if (opts.labels && size_t(pos) < l.pieces.size())
        t.label = short_label(l.pieces[size_t(pos)]);
      t.highlighted = pos >= lit0 && pos < lit1;
      // The token this step generated drops into its slot.
      if (l.state == LaneState::Running && !l.step_prompt && l.step_tokens > 0 && pos == n - 1 &&
          pos >= l.prompt_tokens)
        t.drop = 0.9f;
      s->tokens.push_back(std::move(t));
    }
    // Speculative decoding: the drafted tokens the target kept drop into their slots like
    // a generated token (they end just before the target's own next token).
    if (!l.drafted.empty()) {
      const int kept_from = n - 1 - l.accepted;
      for (int pos = std::max(kept_from, 0); pos < n - 1; ++pos)
        s->tokens[s->tokens.size() - size_t(n - pos)].drop = 0.9f;
    }
    // Logical block boundaries: a thin upright bar between the last position of one block
    // and the first of the next (one per block, never one per token).
    const float y = g.lane_y(int(k));
    for (int b = 1; b * bs < n + 1; ++b) {
      render::MarkerInstance m;
      m.center = {(float(b * bs) - 0.5f) * kServingTokenPitch, y, 0.0f};
      m.size = {0.07f, kTokenSize * 1.35f, kTokenSize * 0.9f};
      m.color = glm::vec3(0.42f, 0.47f, 0.58f) * (lane_ended(l.state) ? 0.7f : 1.0f);
      s->markers.push_back(m);
    }
  }
}

void add_tiles(render::Scene* s, const ServingSnapshot& snap, const ServingGeometry& g,
               const ServingViewOptions& opts) {
  s->kv_blocks.reserve(snap.tiles.size());
  for (size_t b = 0; b < snap.tiles.size(); ++b) {
    const PoolTile& t = snap.tiles[b];
    render::KvBlockInstance k;
    k.position = g.tile_center(int(b));
    const Lane* owner = t.owners.empty() ? nullptr : snap.lane(t.owners.front());
    const int color = owner ? owner->color : -1;
    switch (t.state) {
      case TileState::Free:
        k.color = serving_free_color();
        k.brightness = 0.45f;
        break;
      case TileState::Cached:
        k.color = serving_cached_color(color);
        k.brightness = 0.3f;
        break;
      case TileState::Used:
        k.color = owner ? serving_color(color) : glm::vec3(0.8f);  // (owners unknown: white)
        // A partly filled block is a little darker than a full one.
        k.brightness = 0.78f + 0.12f * std::clamp(float(t.n_pos) / float(g.block_size), 0.0f, 1.0f);
        break;
    }
    // Shared: stripes; three or more holders: cross-hatched.
    if (t.refs > 1) k.hatch_k = kHatch / g.tile_size;
    if (t.refs > 2) k.hatch_v = kHatch / g.tile_size;
    switch (t.flash) {
      case TileFlash::None:
        break;
      // White, white-red, red: brightness alone lights a tile in its owner's colour,
      // which reads as no change on a bright hue (and recompute's red as none on a red one).
      case TileFlash::Written:
      case TileFlash::PrefixHit:
        k.flash_brightness = 0.8f;
        k.flash_white = 0.45f;
        break;
      case TileFlash::Cow:
        k.flash_brightness = 0.8f;
        k.flash_recompute = 0.45f;
        k.flash_white = 0.5f;
        break;
      case TileFlash::Evicted:
        k.flash_recompute = 0.8f;
        break;
      case TileFlash::Released:
        k.flash_brightness = 0.6f;
        k.flash_white = 0.5f;
        break;
    }
    k.highlight = int(b) == opts.hovered_tile ? 1.0f : 0.0f;
    s->kv_blocks.push_back(k);
  }
}

// The middle of logical block i's tokens in a lane of n tokens, at the lane's foot.
glm::vec3 block_foot(const ServingGeometry& g, int lane, int i, int n) {
  const int first = i * g.block_size;
  const int last = std::max(first, std::min(first + g.block_size, n) - 1);
  return 0.5f * (g.token_center(lane, first) + g.token_center(lane, last)) -
         glm::vec3(0.0f, 0.5f * kTokenSize, 0.0f);
}

// The lines of `seq`'s block table: from the middle of each logical block's tokens in its
// lane to the tile holding them.
void add_table_lines(render::Scene* s, const ServingSnapshot& snap, const ServingGeometry& g,
                     int seq, float weight) {
  const int lane = serving_lane_of(g, seq);
  const Lane* l = snap.lane(seq);
  if (lane < 0 || !l) return;
  const int n = int(l->ids.size());
  const glm::vec3 color = serving_color(l->color);
  for (size_t i = 0; i < l->table.size(); ++i) {
    const int block = l->table[i];
    if (block < 0 || size_t(block) >= snap.tiles.size()) continue;
    render::Beam bm;
    bm.from = block_foot(g, lane, int(i), n);
    bm.to = g.tile_center(block);
    bm.weight = weight;
    bm.color = color;
    s->beams.push_back(bm);
  }
}

// Blocks going back to the pool this step (see build_serving_scene): each position the
// lane held in the block is a token-sized block that flies from its slot in the lane to its
// slot in the tile (a page of block_size positions, drawn as a grid of ceil(sqrt(B))
// columns), as the lane's tokens pour into the page; it shrinks as it lands (leave).
// Drawn at the landing place; slide (x) and drop (y) are what is still to travel.
void add_returns(render::Scene* s, const ServingSnapshot& snap, const ServingSnapshot& prev,
                 const ServingGeometry& g) {
  const int B = g.block_size;
  const int cols = std::max(1, int(std::ceil(std::sqrt(double(B)))));
  const float cell = g.tile_size / float(cols);
  for (size_t b = 0; b < snap.tiles.size(); ++b) {
    if (snap.tiles[b].flash != TileFlash::Released) continue;
    for (const Lane& was : prev.lanes) {
      const auto it = std::find(was.table.begin(), was.table.end(), int32_t(b));
      if (it == was.table.end()) continue;
      const int lane = serving_lane_of(g, was.seq);
      if (lane < 0) break;
      const int first = int(it - was.table.begin()) * B;
      const int held = std::min({first + B, was.computed, int(was.ids.size())});
      const glm::vec3 corner = g.tile_center(int(b)) +
                               glm::vec3(-0.5f * g.tile_size + 0.5f * cell,
                                         0.5f * g.tile_size - 0.5f * cell, 0.0f);
      for (int p = first; p < held; ++p) {
        const int j = p - first;
        const glm::vec3 from = g.token_center(lane, p);
        render::TokenInstance t;
        t.position = corner + glm::vec3(float(j % cols) * cell, -float(j / cols) * cell, 0.0f);
        t.slide = from.x - t.position.x;
        t.drop = from.y - t.position.y;
        t.color = serving_color(was.color);
        t.brightness = 0.9f;
        t.leave = 1.0f;
        s->tokens.push_back(std::move(t));
      }
      break;  // its first holder's (a shared block goes back once)
    }
  }
}

// Where a lane's write head sits: its next slot.
glm::vec3 head_slot(const ServingGeometry& g, int lane, const Lane& l) {
  return g.token_center(lane, int(l.ids.size()));
}

}  // namespace

render::Scene build_serving_scene(const ServingSnapshot& snap, const ServingViewOptions& opts,
                                  const AnimClock& clock, const ServingSnapshot* prev) {
  render::Scene s;
  s.revision = render::next_scene_revision();
  const ServingGeometry g = serving_geometry(snap);
  s.token_size = glm::vec3(kTokenSize);
  s.kv_block_size = {g.tile_size, g.tile_size,
                     kTileDepth * std::sqrt(g.tile_pitch / kServingTilePitch)};
  s.labels_vertical = true;
  s.label_height = 0.36f;
  // An upright wall of lanes and tiles: no floor under it, and no depth haze (a long run's
  // wall is framed from far away; the haze would only dim the far tiles' colours).
  s.grid.visible = false;
  s.haze = 0.0f;
  s.grid.height = g.pool_min.y - 1.0f;
  // Beams rise a little (an attention fan reads as arcs over its lane) and bow toward the
  // camera (+z), so the block-table lines stand off the tiles they cross.
  s.anim.beam_arc = {0.3f, 0.05f, -0.05f};

  add_lanes(&s, snap, g, opts);
  add_branches(&s, snap, g);
  add_ghosts(&s, snap, g);
  if (prev && prev->run == snap.run && prev->step + 1 == snap.step) add_returns(&s, snap, *prev, g);
  add_tiles(&s, snap, g, opts);

  // The write heads: the scene's one head on the selected lane (else the first running one),
  // an emissive marker in the next slot of every other running lane.
  int head_lane = -1;
  const int selected_lane = serving_lane_of(g, opts.selected_seq);
  if (selected_lane >= 0 && snap.lane(opts.selected_seq)->state == LaneState::Running)
    head_lane = selected_lane;
  for (size_t k = 0; k < g.lane_seq.size() && head_lane < 0; ++k)
    if (snap.lane(g.lane_seq[k])->state == LaneState::Running) head_lane = int(k);
  s.head.visible = head_lane >= 0;
  s.head.radius = 0.36f;
  s.head.min_px = kHeadMinPx;
  if (head_lane >= 0)
    s.head.position = head_slot(g, head_lane, *snap.lane(g.lane_seq[size_t(head_lane)]));
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane& l = *snap.lane(g.lane_seq[k]);
    if (l.state != LaneState::Running || int(k) == head_lane) continue;
    render::MarkerInstance m;
    m.center = head_slot(g, int(k), l);
    m.size = glm::vec3(0.42f);
    m.color = {1.0f, 0.85f, 0.45f};
    s.markers.push_back(m);
  }

  // Block-table lines of the selected and hovered lanes; the selected lane's attention.
  if (opts.hovered_seq >= 0 && opts.hovered_seq != opts.selected_seq)
    add_table_lines(&s, snap, g, opts.hovered_seq, 0.55f);
  if (opts.selected_seq >= 0) add_table_lines(&s, snap, g, opts.selected_seq, 0.95f);
  if (selected_lane >= 0) {
    const Lane& l = *snap.lane(opts.selected_seq);
    const int n = std::min<int>(int(l.attention.size()), int(l.ids.size()));
    float mx = 0.0f;
    for (int j = 0; j < n; ++j) mx = std::max(mx, l.attention[size_t(j)]);
    const glm::vec3 from = head_slot(g, selected_lane, l);
    // Over a long sequence, the strongest kServingMaxBeams only (of equal ones at the cut,
    // the first).
    float cut = 0.0f;
    int ties = n;
    if (n > kServingMaxBeams) {
      std::vector<float> w(l.attention.begin(), l.attention.begin() + n);
      std::nth_element(w.begin(), w.begin() + (kServingMaxBeams - 1), w.end(), std::greater<>());
      cut = w[size_t(kServingMaxBeams - 1)];
      ties = kServingMaxBeams;
      for (int j = 0; j < n; ++j) ties -= l.attention[size_t(j)] > cut;
    }
    for (int j = 0; j < n; ++j) {
      const float wj = l.attention[size_t(j)];
      if (wj < cut || (wj == cut && ties-- <= 0)) continue;
      render::Beam bm;
      bm.from = from;
      bm.to = g.token_center(selected_lane, j) + glm::vec3(0.0f, 0.5f * kTokenSize, 0.0f);
      bm.weight = 0.8f * beam_brightness(l.attention[size_t(j)], mx);  // the tiles' lines first
      bm.color = render::palette::kBeam;
      s.beams.push_back(bm);
    }
  }
  animate_serving_scene(&s, clock);
  return s;
}

void animate_serving_scene(render::Scene* scene, const AnimClock& clock) {
  render::Scene& s = *scene;
  const float since = float(clock.since_step);
  s.anim.flash = std::exp(-since / 0.8f);
  s.anim.fall = 1.0f - smooth01((since - 0.05f) / 0.35f);
  s.anim.slide = s.anim.fall;  // a block going back travels x and y together: a straight path
  s.anim.beam_fade = 0.75f + 0.25f * std::exp(-since / 0.5f);
  s.anim.leave = smooth01(since / 0.8f);  // rejected drafts sink away (tiles never leave)
  const float pulse = 0.5f + 0.5f * std::sin(float(clock.time) * 6.0f);
  s.head.glow = clock.busy ? 0.75f + 0.25f * pulse : 0.8f;
}

}  // namespace kvscope::app
