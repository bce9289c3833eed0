// serving_snapshot_fixture.h — hand-built serving snapshots for the Serving scene's tests
// (no engine, no run): eight sequences over one paged pool, filled the way the scheduler
// leaves it (a shared system prompt adopted from the prefix cache, a parallel sample
// sharing its prompt's blocks, a copy-on-write, a finished sequence whose blocks stay
// cached, a waiting and a preempted sequence), and a large one (16 x 1,000 tokens).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "app/core/serving_run.h"

namespace kvscope::test {

// Adds `lane` to `s`, holding logical blocks `table` (tiles' refs, owners and fill updated).
inline void serving_hold(app::ServingSnapshot* s, app::Lane* lane) {
  const int bs = s->block_size, n = int(lane->computed);
  for (size_t i = 0; i < lane->table.size(); ++i) {
    app::PoolTile& t = s->tiles[size_t(lane->table[i])];
    t.state = app::TileState::Used;
    ++t.refs;
    t.owners.push_back(lane->seq);
    if (t.owners.size() == 1) {
      t.logical = int(i);
      t.first_pos = int(i) * bs;
      t.n_pos = std::min(bs, std::max(0, n - int(i) * bs));
      t.published = t.n_pos == bs;
    }
  }
}

inline app::Lane serving_lane(int seq, int color, app::LaneState st, int prompt, int generated) {
  app::Lane l;
  l.seq = seq;
  l.request = color;
  l.color = color;
  l.state = st;
  l.prompt_tokens = prompt;
  for (int p = 0; p < prompt + generated; ++p) {
    l.ids.push_back(100 + (p * 7 + seq) % 50);
    l.pieces.push_back(p < 32 ? " sys" + std::to_string(p) : " w" + std::to_string(p));
  }
  l.computed =
      st == app::LaneState::Running || st == app::LaneState::Finished ? prompt + generated : 0;
  return l;
}

// Eight sequences, block size 16, 96 blocks:
//   seq 0..4 running; seq 1..4 adopted the 32-token system prompt (blocks 0, 1) from the
//   prefix cache; seq 4 is a second sample of seq 3's request (same colour) sharing its
//   prompt's full blocks, its first private block a copy-on-write target this step;
//   seq 5 finished (its private blocks cached, one of them evicted for new content);
//   seq 6 waiting (prompt only); seq 7 preempted (nothing held).
inline app::ServingSnapshot serving_snapshot_eight() {
  using app::LaneState;
  app::ServingSnapshot s;
  s.run = 7;
  s.step = 40;
  s.block_size = 16;
  s.n_blocks = 96;
  s.max_seqs = 8;
  s.n_requests = 7;
  s.tiles.resize(96);
  int next = 2;  // blocks 0, 1: the system prompt
  auto fresh = [&](int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(next++);
    return t;
  };
  const int own_prompt[8] = {12, 20, 7, 30, 30, 16, 18, 9};
  const int generated[8] = {40, 25, 60, 18, 18, 33, 0, 12};
  const LaneState states[8] = {LaneState::Running, LaneState::Running,  LaneState::Running,
                               LaneState::Running, LaneState::Running,  LaneState::Finished,
                               LaneState::Waiting, LaneState::Preempted};
  const int colors[8] = {0, 1, 2, 3, 3, 4, 5, 6};
  std::vector<app::Lane> lanes;
  for (int i = 0; i < 8; ++i) {
    app::Lane l = serving_lane(i, colors[i], states[i], 32 + own_prompt[i], generated[i]);
    if (i == 4) {
      l.request = 3;
      l.sample = 1;
      l.parent = 3;
    }
    l.cached_tokens = i >= 1 && i != 6 && i != 7 ? 32 : 0;
    lanes.push_back(l);
  }
  for (int i = 0; i < 5; ++i) {
    app::Lane& l = lanes[size_t(i)];
    const int n = int(l.ids.size());
    const int blocks = (n + 15) / 16;
    l.table = {0, 1};
    if (i == 4) {
      // The fork shares seq 3's full prompt blocks; the partly filled one was copied.
      const app::Lane& parent = lanes[3];
      const int shared = l.prompt_tokens / 16;
      l.table.assign(parent.table.begin(), parent.table.begin() + shared);
      std::vector<int32_t> own = fresh(blocks - shared);
      s.tiles[size_t(own.front())].flash = app::TileFlash::Cow;
      l.table.insert(l.table.end(), own.begin(), own.end());
    } else {
      std::vector<int32_t> own = fresh(blocks - 2);
      l.table.insert(l.table.end(), own.begin(), own.end());
    }
    l.step_tokens = 1;
    l.attention.resize(size_t(n));
    for (int j = 0; j < n; ++j)
      l.attention[size_t(j)] = j == 0 ? 0.4f : 0.6f / float(n) * (1 + j % 5);
    serving_hold(&s, &l);
    s.tiles[size_t(l.table.back())].flash = app::TileFlash::Written;
  }
  // The finished sequence's blocks: the full ones stay in the prefix cache (the first one
  // just evicted for new content), the last one went back to the free list.
  {
    const app::Lane& l = lanes[5];
    const int blocks = (int(l.ids.size()) + 15) / 16;
    std::vector<int32_t> own = fresh(blocks - 2);
    for (size_t k = 0; k < own.size(); ++k) {
      app::PoolTile& t = s.tiles[size_t(own[k])];
      const bool full = k + 1 < own.size();
      t.state = full ? app::TileState::Cached : app::TileState::Free;
      t.published = full;
      t.flash = k == 0                ? app::TileFlash::Evicted
                : k + 1 == own.size() ? app::TileFlash::Released
                                      : app::TileFlash::None;
      if (full) t.owners = {};  // nobody holds it; the cache keeps it
    }
  }
  s.lanes = lanes;
  s.waiting = {7, 6};
  return s;
}

// `lanes` running sequences of `tokens` tokens each, no sharing (the performance case).
inline app::ServingSnapshot serving_snapshot_large(int lanes, int tokens) {
  app::ServingSnapshot s;
  s.run = 9;
  s.step = tokens;
  s.block_size = 16;
  const int per = (tokens + 15) / 16;
  s.n_blocks = lanes * per + 64;
  s.n_requests = lanes;
  s.tiles.resize(size_t(s.n_blocks));
  int next = 0;
  for (int i = 0; i < lanes; ++i) {
    app::Lane l = serving_lane(i, i, app::LaneState::Running, 40, tokens - 40);
    for (int b = 0; b < per; ++b) l.table.push_back(next++);
    l.step_tokens = 1;
    l.attention.assign(size_t(tokens), 1.0f / float(tokens));
    serving_hold(&s, &l);
    s.lanes.push_back(std::move(l));
  }
  return s;
}

// The step after `before`: sequence `seq` was preempted, so its own blocks went back (free,
// flashing Released; their ids into *released, in block id order) and the blocks it shared stay
// with the others; no other tile flashes.
inline app::ServingSnapshot serving_preempted_after(const app::ServingSnapshot& before, int seq,
                                                    std::vector<int32_t>* released) {
  app::ServingSnapshot s = before;
  s.step = before.step + 1;
  app::Lane& l = s.lanes[size_t(seq)];
  for (app::PoolTile& t : s.tiles) t.flash = app::TileFlash::None;
  for (int32_t b : l.table) {
    app::PoolTile& t = s.tiles[size_t(b)];
    std::erase(t.owners, seq);
    if (--t.refs > 0) continue;
    t.state = app::TileState::Free;
    t.flash = app::TileFlash::Released;
    t.logical = -1;
    released->push_back(b);
  }
  std::sort(released->begin(), released->end());
  l.state = app::LaneState::Preempted;
  l.table.clear();
  l.computed = 0;
  return s;
}

}  // namespace kvscope::test
