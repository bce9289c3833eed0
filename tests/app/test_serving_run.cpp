// test_serving_run.cpp — the Serving view's engine (app/core/serving_run.h) on the default
// model, driven step by step like the headless capture drives it:
//   - after every step the tiles agree with the pool (used / cached / free counts, every
//     reference is a lane's table entry) and every lane's table is Used tiles owning it;
//   - a shared system prefix: later requests adopt its blocks (PrefixHit events, cached
//     tokens, tiles with two references flashing PrefixHit);
//   - Gemma 3's layer groups: every group's blocks are tiles its lanes own;
//   - a pool too small for everyone: a preemption shows as a Preempted lane, and every
//     request still finishes; a cached block taken for new content flashes Evicted;
//   - parallel sampling: a Fork, then the copy-on-write tile when the samples write the
//     shared last block;
//   - beam search: each beam a lane forked off its parent's tokens, pruned ones ended and
//     their own blocks back in the pool in the same step;
//   - greedy lanes equal the same prompt served alone;
//   - the worker thread: paused start, single steps, pause/play, destruction while playing,
//     and errors (bad model path, empty prompt, a request that cannot fit) in the snapshot.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include <unistd.h>

#include "app/core/serving_build.h"
#include "app/core/serving_record.h"
#include "app/core/serving_run.h"
#include "engine/bootstrap/bootstrap.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/util/timing.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

constexpr const char* kAbsent = "default model absent: run scripts/fetch_model.sh";
bool have_model() {
  return std::filesystem::exists(KVSCOPE_DEFAULT_MODEL);
}

EngineOptions engine_options() {
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  eo.threads = 2;
  return eo;
}

const std::vector<PromptSpec> kPrompts = {
    {"The capital of France is", false},
    {"def add(a, b):\n    return", false},
    {"Once upon a time, a small fox", false},
    {"The three primary colours are", false},
};
// About 40 tokens: two full blocks of 16 and part of a third.
const char* kSystem =
    "You are a careful assistant. Answer in one short sentence, with plain words, and never "
    "invent facts that you cannot check. If a question is unclear, say so and ask again.";

ServingConfig small_config(int max_tokens) {
  ServingConfig c;
  c.scheduler.block_size = 16;
  c.scheduler.context = 256;
  c.scheduler.stop_at_eos = false;  // every request runs its max_tokens
  c.workload.prompts = kPrompts;
  c.workload.max_tokens = max_tokens;
  c.workload.arrival = "every:2";
  return c;
}

const Lane* find_lane(const ServingSnapshot& s, int seq) {
  for (const Lane& l : s.lanes)
    if (l.seq == seq) return &l;
  return nullptr;
}

// The tiles against the pool's counts and the lanes' tables, after one step.
void check_tiles(const ServingSnapshot& s) {
  SCOPED_TRACE("step " + std::to_string(s.step));
  ASSERT_EQ(int(s.tiles.size()), s.n_blocks);
  ASSERT_FALSE(s.history.empty());
  const ServingPoint& p = s.history.back();
  EXPECT_EQ(p.step, s.step);
  int used = 0, cached = 0, free = 0;
  for (int b = 0; b < s.n_blocks; ++b) {
    const PoolTile& t = s.tiles[size_t(b)];
    used += t.state == TileState::Used;
    cached += t.state == TileState::Cached;
    free += t.state == TileState::Free;
    // One model group: each reference is one lane's table entry.
    EXPECT_EQ(t.refs, int(t.owners.size())) << "block " << b;
    EXPECT_EQ(t.state == TileState::Used, t.refs > 0) << "block " << b;
    if (t.state == TileState::Cached) {
      EXPECT_TRUE(t.published) << "block " << b;
    }
    EXPECT_TRUE(std::is_sorted(t.owners.begin(), t.owners.end()));
    EXPECT_LE(t.n_pos, s.block_size);
  }
  EXPECT_EQ(used, p.used);
  EXPECT_EQ(cached, p.cached);
  EXPECT_EQ(free, p.free);
  EXPECT_EQ(used + cached + free, s.n_blocks);
  for (const Lane& l : s.lanes) {
    if (l.state != LaneState::Running) {
      EXPECT_TRUE(l.table.empty()) << "seq " << l.seq;
    }
    EXPECT_EQ(int(l.table.size()), (l.computed + s.block_size - 1) / s.block_size)
        << "seq " << l.seq;
    for (int32_t b : l.table) {
      ASSERT_GE(b, 0);
      ASSERT_LT(b, s.n_blocks);
      const PoolTile& t = s.tiles[size_t(b)];
      EXPECT_EQ(t.state, TileState::Used) << "seq " << l.seq << " block " << b;
      EXPECT_NE(std::find(t.owners.begin(), t.owners.end(), l.seq), t.owners.end())
          << "seq " << l.seq << " block " << b;
    }
    EXPECT_EQ(l.ids.size(), l.pieces.size());
    if (!l.attention.empty()) {  // over the positions before the token it just sampled
      // (a beam pruned in this step sampled none: over all of its positions)
      EXPECT_EQ(l.attention.size() + (l.stop == "pruned" ? 0 : 1), l.ids.size()) << "seq " << l.seq;
      if (l.state == LaneState::Running) {
        EXPECT_EQ(int(l.attention.size()), l.computed);
      }
      float sum = 0;
      for (float a : l.attention) sum += a;
      EXPECT_NEAR(sum, 1.0f, 1e-3f) << "seq " << l.seq;
    }
  }
}

// Runs the paused run one step at a time until it is done, checking each snapshot; the
// snapshots, oldest first.
std::vector<std::shared_ptr<const ServingSnapshot>> run_steps(ServingRun& run, int max_steps) {
  std::vector<std::shared_ptr<const ServingSnapshot>> out;
  for (int k = 1; k <= max_steps; ++k) {
    run.wait_until(k, 120);
    auto s = run.snapshot();
    EXPECT_TRUE(s->error.empty()) << s->error;
    if (!s->error.empty()) break;
    EXPECT_EQ(s->step, k);
    check_tiles(*s);
    out.push_back(s);
    if (s->done) break;
  }
  return out;
}

}  // namespace

TEST(ServingRun, ArrivalSteps) {
  EXPECT_EQ(arrival_steps("all", 3, 1).value(), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(arrival_steps("every:2", 3, 1).value(), (std::vector<int>{1, 3, 5}));
  auto p = arrival_steps("poisson:0.5", 4, 7);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(std::is_sorted(p->begin(), p->end()));
  EXPECT_FALSE(arrival_steps("every:0", 3, 1).ok());
  EXPECT_FALSE(arrival_steps("sometimes", 3, 1).ok());
}

// 1 and 2: the tiles after every step, and a shared prefix of two blocks hit by later
// requests.
TEST(ServingRun, SharedPrefixHitsAndTilesMatchThePool) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingRun run(engine_options());
  ServingConfig cfg = small_config(6);
  cfg.workload.shared_prefix = kSystem;
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 64);
  ASSERT_FALSE(snaps.empty());
  const ServingSnapshot& last = *snaps.back();
  ASSERT_TRUE(last.done);
  ASSERT_EQ(last.lanes.size(), kPrompts.size());
  for (const Lane& l : last.lanes) {
    EXPECT_EQ(l.state, LaneState::Finished) << "seq " << l.seq;
    EXPECT_EQ(int(l.ids.size()), l.prompt_tokens + 6);
    EXPECT_EQ(l.stop, "max_tokens");
    EXPECT_GE(l.ttft_ms, 0);
  }
  // Every lane's prompt starts with the same prefix tokens.
  const Lane& l0 = last.lanes[0];
  ASSERT_GE(l0.prompt_tokens, 2 * last.block_size + 4);
  for (const Lane& l : last.lanes)
    EXPECT_TRUE(std::equal(l0.ids.begin(), l0.ids.begin() + 2 * last.block_size, l.ids.begin()));

  int hits = 0;
  bool shared_hit_tile = false;
  for (const auto& s : snaps) {
    for (const SchedEvent& e : s->events) {
      if (e.kind != EventKind::PrefixHit) continue;
      ++hits;
      EXPECT_GT(e.seq, 0) << "the first request finds an empty cache";
      EXPECT_GE(e.n, 2 * s->block_size);
      const Lane* l = find_lane(*s, e.seq);
      ASSERT_NE(l, nullptr);
      EXPECT_EQ(l->cached_tokens, e.n);
      // Its first blocks flash PrefixHit and count the hit.
      for (int i = 0; i < e.n / s->block_size; ++i) {
        const PoolTile& t = s->tiles[size_t(l->table[size_t(i)])];
        EXPECT_EQ(t.flash, TileFlash::PrefixHit) << "step " << s->step << " block " << i;
        EXPECT_GE(t.hash_hits, 1);
        EXPECT_TRUE(t.published);
        if (t.refs >= 2) shared_hit_tile = true;
      }
    }
  }
  EXPECT_GE(hits, 3) << "requests 1..3 adopt the prefix";
  EXPECT_TRUE(shared_hit_tile) << "an adopted block also held by a running request";
  EXPECT_GT(last.totals.prefix_hit_tokens, 0u);
  EXPECT_GT(last.history.back().prefix_hit_rate, 0);
}

// Gemma 3: its windowed and global layers keep blocks of their own (layer groups): every
// group's blocks are tiles owned by the lanes, and the prefix is hit in both.
TEST(ServingRun, TwoLayerGroupsTilesAndPrefixHits) {
  if (!std::filesystem::exists(KVSCOPE_GEMMA_MODEL))
    GTEST_SKIP() << "Gemma 3 absent: run scripts/fetch_model.sh gemma3-270m";
  EngineOptions eo = engine_options();
  eo.model_path = KVSCOPE_GEMMA_MODEL;
  ServingRun run(eo);
  ServingConfig cfg = small_config(3);
  cfg.workload.prompts = {kPrompts[0], kPrompts[1]};
  cfg.workload.shared_prefix = kSystem;
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 32);
  ASSERT_FALSE(snaps.empty());
  ASSERT_TRUE(snaps.back()->done);
  // Groups: the tiles a lane owns per entry of its first group's table.
  int groups = 0;
  bool hit = false;
  for (const auto& s : snaps) {
    for (const Lane& l : s->lanes) {
      if (l.table.empty()) continue;
      int held = 0;
      for (const PoolTile& t : s->tiles)
        held += int(std::count(t.owners.begin(), t.owners.end(), l.seq));
      EXPECT_EQ(held % int(l.table.size()), 0) << "step " << s->step << " seq " << l.seq;
      if (groups == 0) groups = held / int(l.table.size());
      EXPECT_EQ(held, groups * int(l.table.size())) << "step " << s->step << " seq " << l.seq;
    }
    for (const SchedEvent& e : s->events) {
      if (e.kind != EventKind::PrefixHit) continue;
      hit = true;
      int flashed = 0;
      for (const PoolTile& t : s->tiles) flashed += t.flash == TileFlash::PrefixHit;
      EXPECT_EQ(flashed, groups * (e.n / s->block_size)) << "the hit blocks of every group";
    }
  }
  EXPECT_GE(groups, 2);
  EXPECT_TRUE(hit);
}

// 3: a pool too small for everyone at once.
TEST(ServingRun, PreemptionShowsAndEveryRequestFinishes) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingRun run(engine_options());
  ServingConfig cfg = small_config(24);
  cfg.workload.arrival = "all";
  cfg.scheduler.pool_blocks = 6;  // one request needs at most 3
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 400);
  ASSERT_FALSE(snaps.empty());
  bool saw = false;
  for (const auto& s : snaps)
    for (const SchedEvent& e : s->events)
      if (e.kind == EventKind::Preempt) {
        saw = true;
        const Lane* l = find_lane(*s, e.seq);
        ASSERT_NE(l, nullptr);
        EXPECT_EQ(l->state, LaneState::Preempted) << "step " << s->step;
        EXPECT_TRUE(l->table.empty());
        EXPECT_GE(l->preemptions, 1);
        EXPECT_NE(std::find(s->waiting.begin(), s->waiting.end(), e.seq), s->waiting.end());
      }
  EXPECT_TRUE(saw) << "six blocks cannot hold four requests of three";
  // The finishing requests' blocks flash Released and stay cached when full.
  bool released_cached = false;
  for (const auto& s : snaps)
    for (const PoolTile& t : s->tiles)
      released_cached |= t.flash == TileFlash::Released && t.state == TileState::Cached;
  EXPECT_TRUE(released_cached);
  const ServingSnapshot& last = *snaps.back();
  ASSERT_TRUE(last.done);
  for (const Lane& l : last.lanes) {
    EXPECT_EQ(l.state, LaneState::Finished) << "seq " << l.seq;
    EXPECT_EQ(int(l.ids.size()), l.prompt_tokens + 24) << "seq " << l.seq;
  }
  EXPECT_GT(last.totals.preemptions, 0);
  EXPECT_EQ(last.history.back().used, 0);
}

// A cached block taken for new content: one request at a time through four blocks, the
// first request's two full blocks cached when it finishes, the second's third block evicts
// the least recently used of them.
TEST(ServingRun, CachedBlocksAreEvictedForNewContent) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingRun run(engine_options());
  ServingConfig cfg = small_config(40);  // 5 to 9 prompt tokens + 40: three blocks
  cfg.workload.prompts = {kPrompts[0], kPrompts[2]};
  cfg.workload.arrival = "all";
  cfg.scheduler.pool_blocks = 4;
  cfg.scheduler.max_seqs = 1;
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 200);
  ASSERT_FALSE(snaps.empty());
  ASSERT_TRUE(snaps.back()->done);
  int evicted = 0;
  for (size_t k = 1; k < snaps.size(); ++k)
    for (size_t b = 0; b < snaps[k]->tiles.size(); ++b) {
      const PoolTile& t = snaps[k]->tiles[b];
      if (t.flash != TileFlash::Evicted) continue;
      ++evicted;
      EXPECT_EQ(snaps[k - 1]->tiles[b].state, TileState::Cached);
      EXPECT_EQ(t.state, TileState::Used);
      ASSERT_EQ(t.owners.size(), 1u);
      EXPECT_EQ(t.owners[0], 1) << "the second request's new block";
    }
  EXPECT_EQ(evicted, 1);
}

// 4: two samples of one prompt: a fork, then a copy-on-write of the shared last block.
TEST(ServingRun, ForkThenCopyOnWrite) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingRun run(engine_options());
  ServingConfig cfg = small_config(4);
  cfg.workload.prompts = {kPrompts[0]};  // a few tokens: a partly filled block
  cfg.workload.n = 2;
  cfg.workload.sampler.temperature = 0.8f;
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 32);
  ASSERT_GE(snaps.size(), 2u);
  int fork_step = -1;
  for (const auto& s : snaps)
    for (const SchedEvent& e : s->events)
      if (e.kind == EventKind::Fork) {
        fork_step = s->step;
        EXPECT_EQ(e.seq, 1);
        EXPECT_EQ(e.n, 0);
        const Lane* l = find_lane(*s, 1);
        ASSERT_NE(l, nullptr);
        EXPECT_EQ(l->parent, 0);
        EXPECT_EQ(l->sample, 1);
        // Both samples hold the prompt's block.
        ASSERT_FALSE(l->table.empty());
        EXPECT_EQ(s->tiles[size_t(l->table[0])].refs, 2);
      }
  ASSERT_GT(fork_step, 0);
  ASSERT_LT(size_t(fork_step), snaps.size());
  const ServingSnapshot& next = *snaps[size_t(fork_step)];  // the step after the fork
  ASSERT_EQ(next.step, fork_step + 1);
  bool cow_event = false;
  for (const SchedEvent& e : next.events) cow_event |= e.kind == EventKind::Cow;
  EXPECT_TRUE(cow_event);
  int cow_tiles = 0;
  for (const PoolTile& t : next.tiles)
    if (t.flash == TileFlash::Cow) {
      ++cow_tiles;
      EXPECT_EQ(t.refs, 1) << "a private copy";
      EXPECT_EQ(t.logical, 0);
    }
  EXPECT_EQ(cow_tiles, 1);
  const Lane* a = find_lane(next, 0);
  const Lane* b = find_lane(next, 1);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->table[0], b->table[0]) << "the samples no longer share the block they write";
}

// Beam search: each beam a lane. A fork's lane starts as its parent's tokens at the step it
// branched (its own token next); a pruned beam's lane ends "pruned" and holds nothing, and
// the tiles its table named that no live beam holds are back in the pool in that step's
// snapshot; the lanes' final hypotheses are the scheduler's (the best first).
TEST(ServingRun, BeamSearchLanesForkAndPrunedBeamsGiveTheirBlocksBack) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingRun run(engine_options());
  ServingConfig cfg = small_config(14);
  cfg.workload.prompts = {kPrompts[2], kPrompts[0]};
  cfg.workload.beams = 3;
  cfg.workload.arrival = "all";
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 64);
  ASSERT_FALSE(snaps.empty());
  ASSERT_TRUE(snaps.back()->done);
  int forks = 0, pruned = 0;
  for (size_t k = 1; k < snaps.size(); ++k) {
    const ServingSnapshot& before = *snaps[k - 1];
    const ServingSnapshot& s = *snaps[k];
    SCOPED_TRACE("step " + std::to_string(s.step));
    for (const SchedEvent& e : s.events) {
      if (e.kind == EventKind::Fork) {
        ++forks;
        const Lane* child = find_lane(s, e.seq);
        const Lane* parent_before = find_lane(before, e.n);
        ASSERT_TRUE(child && parent_before);
        EXPECT_EQ(child->parent, e.n);
        EXPECT_EQ(child->sample, 0) << "a beam is no sample";
        EXPECT_EQ(child->request, parent_before->request);
        // Its tokens: the parent's before this step, then its own.
        ASSERT_EQ(child->ids.size(), parent_before->ids.size() + 1);
        EXPECT_TRUE(std::equal(parent_before->ids.begin(), parent_before->ids.end(),
                               child->ids.begin()));
      }
      if (e.kind == EventKind::Finish && e.detail == "pruned") {
        ++pruned;
        const Lane* l = find_lane(s, e.seq);
        ASSERT_NE(l, nullptr);
        EXPECT_EQ(l->state, LaneState::Finished);
        EXPECT_EQ(l->stop, "pruned");
        EXPECT_TRUE(l->table.empty());
        // Its blocks before this step that no lane holds now are free or cached again.
        const Lane* was = find_lane(before, e.seq);
        ASSERT_NE(was, nullptr);
        for (int32_t b : was->table) {
          const PoolTile& t = s.tiles[size_t(b)];
          if (t.owners.empty()) {
            EXPECT_NE(t.state, TileState::Used) << "block " << b;
            EXPECT_EQ(t.flash, TileFlash::Released) << "block " << b;
          }
        }
      }
    }
  }
  EXPECT_GT(forks, 4);
  EXPECT_GT(pruned, 0);
  // At the end every beam ended and nothing is held.
  for (const Lane& l : snaps.back()->lanes) {
    EXPECT_NE(l.state, LaneState::Running) << "seq " << l.seq;
    EXPECT_TRUE(l.table.empty());
  }
  EXPECT_EQ(snaps.back()->history.back().used, 0);
}

// 5: a greedy lane in a batch is the same prompt served alone.
TEST(ServingRun, GreedyLaneEqualsThePromptAlone) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  const int kTokens = 8;
  ServingRun run(engine_options());
  ServingConfig cfg = small_config(kTokens);
  cfg.workload.arrival = "every:1";
  run.start(cfg, /*play=*/false);
  auto snaps = run_steps(run, 64);
  ASSERT_FALSE(snaps.empty());
  ASSERT_TRUE(snaps.back()->done);
  const Lane* lane = find_lane(*snaps.back(), 2);
  ASSERT_NE(lane, nullptr);

  auto model = load_model(KVSCOPE_DEFAULT_MODEL);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto backend = make_cpu_backend(2);
  SchedulerConfig sc = cfg.scheduler;
  auto sched = Scheduler::create(*model, *backend, sc);
  ASSERT_TRUE(sched.ok()) << sched.error().message;
  Request r;
  r.prompt.assign(lane->ids.begin(), lane->ids.begin() + lane->prompt_tokens);
  r.max_tokens = kTokens;
  r.sampler = cfg.workload.sampler;
  auto id = (*sched)->add(r);
  ASSERT_TRUE(id.ok());
  while (!(*sched)->idle()) ASSERT_TRUE((*sched)->step().ok());
  const std::vector<int32_t> batched(lane->ids.begin() + lane->prompt_tokens, lane->ids.end());
  EXPECT_EQ(batched, (*sched)->generated(*id));
}

// Speculation by a draft model (--speculative draft:PATH): the default model drafts for
// itself, in caches of its own. Greedy, so every request's tokens are the plain run's
// (speculative greedy = plain greedy); drafts were made and kept. A draft file that is no
// model is one error in the snapshot, and the run is usable after it.
TEST(ServingRun, DraftModelSpeculationKeepsGreedyTokens) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingConfig plain_cfg = small_config(12);
  plain_cfg.workload.arrival = "all";
  ServingRun run(engine_options());
  run.start(plain_cfg, false);
  auto plain = run_steps(run, 64);
  ASSERT_FALSE(plain.empty());
  ASSERT_TRUE(plain.back()->done);

  ServingConfig spec_cfg = plain_cfg;
  spec_cfg.scheduler.speculation.kind = DraftKind::Model;
  spec_cfg.scheduler.speculation.draft_path = KVSCOPE_DEFAULT_MODEL;
  spec_cfg.scheduler.speculation.draft_max = 4;
  run.start(spec_cfg, false);
  auto spec = run_steps(run, 64);
  ASSERT_FALSE(spec.empty());
  ASSERT_TRUE(spec.back()->done);
  EXPECT_LT(spec.back()->step, plain.back()->step);  // several tokens a step
  EXPECT_GT(spec.back()->totals.drafted, 0u);
  EXPECT_GT(spec.back()->totals.accepted, 0u);
  ASSERT_EQ(spec.back()->lanes.size(), plain.back()->lanes.size());
  for (size_t i = 0; i < plain.back()->lanes.size(); ++i)
    EXPECT_EQ(spec.back()->lanes[i].ids, plain.back()->lanes[i].ids) << "lane " << i;

  ServingConfig bad = spec_cfg;
  bad.scheduler.speculation.draft_path = "/nonexistent/draft.gguf";
  run.start(bad, true);
  run.wait_until(1, 60);
  EXPECT_NE(run.snapshot()->error.find("draft"), std::string::npos) << run.snapshot()->error;
  run.start(plain_cfg, false);
  auto again = run_steps(run, 64);
  ASSERT_FALSE(again.empty());
  EXPECT_TRUE(again.back()->done);
}

// 6: the worker thread and errors.
TEST(ServingRun, PausedStartStepsPlayPauseAndPromptDestruction) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  using Clock = std::chrono::steady_clock;
  auto run = std::make_unique<ServingRun>(engine_options());
  EXPECT_EQ(run->snapshot()->step, 0);
  ServingConfig cfg = small_config(200);
  cfg.workload.arrival = "all";
  run->start(cfg, /*play=*/false);
  run->wait_until(0, 120);
  EXPECT_EQ(run->snapshot()->step, 0);
  EXPECT_EQ(run->snapshot()->n_requests, 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(run->snapshot()->step, 0) << "paused: nothing runs";
  run->step();
  const auto poll = [&](auto pred) {
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (!pred(*run->snapshot()) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return pred(*run->snapshot());
  };
  EXPECT_TRUE(poll([](const ServingSnapshot& s) { return s.step == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(run->snapshot()->step, 1) << "one step asked, one step run";

  run->set_speed(0);
  run->play();
  EXPECT_TRUE(poll([](const ServingSnapshot& s) { return s.step >= 4 && s.playing; }));
  run->pause();
  const int at_pause = run->snapshot()->step;
  EXPECT_FALSE(run->snapshot()->playing) << "the snapshot shows a pause at once";
  // Only the step in flight may still end (however long it takes under a sanitizer):
  // never a step after it.
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_LE(run->snapshot()->step, at_pause + 1) << "a step ran after the pause";
  }
  const int paused_at = run->snapshot()->step;

  run->set_speed(20);  // paced: 50 ms apart
  run->play();
  EXPECT_TRUE(poll([&](const ServingSnapshot& s) { return s.step >= paused_at + 2; }));
  const auto t0 = Clock::now();
  run.reset();  // destruction while playing: the step in flight ends, nothing after it
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(),
            5.0 * test::time_limit_scale());
}

TEST(ServingRun, ErrorsArriveInTheSnapshot) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  {
    EngineOptions eo = engine_options();
    eo.model_path = "/nonexistent/model.gguf";
    ServingRun run(eo);
    run.start(small_config(4), true);
    run.wait_until(1, 60);
    const auto s = run.snapshot();
    EXPECT_NE(s->error.find("model.gguf"), std::string::npos) << s->error;
    EXPECT_EQ(s->step, 0);
  }
  ServingRun run(engine_options());
  ServingConfig bad = small_config(4);
  bad.workload.prompts[2].text = "";
  run.start(bad, true);
  run.wait_until(1, 60);
  EXPECT_NE(run.snapshot()->error.find("prompt 2"), std::string::npos) << run.snapshot()->error;

  ServingConfig big = small_config(4);
  big.scheduler.context = 16;
  big.workload.shared_prefix = kSystem;  // 40 tokens: more than the context
  run.start(big, true);
  run.wait_until(1, 60);
  EXPECT_NE(run.snapshot()->error.find("prompt 0"), std::string::npos) << run.snapshot()->error;

  ServingConfig arrival = small_config(4);
  arrival.workload.arrival = "soon";
  run.start(arrival, true);
  run.wait_until(1, 60);
  EXPECT_NE(run.snapshot()->error.find("soon"), std::string::npos) << run.snapshot()->error;

  // The same run object still serves a good workload afterwards.
  run.start(small_config(2), false);
  run.wait_until(3, 120);
  const auto s = run.snapshot();
  EXPECT_TRUE(s->error.empty()) << s->error;
  EXPECT_EQ(s->step, 3);
  EXPECT_FALSE(s->lanes.empty());
}

// A long run stays bounded: with more requests ending than kServingKeptEnded, the oldest
// ended sequences leave the snapshots' lanes (the newest ones stay, every live one stays),
// and the pool's tiles still match the engine's counts; recording such a run replays it.
TEST(ServingRun, EndedLanesLeaveTheSnapshotsOfALongRun) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  const int requests = int(kServingKeptEnded) + 12;
  ServingConfig c = small_config(1);
  c.workload.prompts.clear();
  for (int i = 0; i < requests; ++i) c.workload.prompts.push_back(kPrompts[size_t(i) % 4]);
  c.workload.arrival = "all";
  c.scheduler.max_seqs = 16;
  const std::string rec = ::testing::TempDir() + "serving_long_" + std::to_string(getpid()) + ".kvs";
  c.record_path = rec;
  std::shared_ptr<const ServingSnapshot> last;
  {
    ServingRun run(engine_options());
    run.start(c, false);
    auto snaps = run_steps(run, 200);
    ASSERT_FALSE(snaps.empty());
    last = snaps.back();
  }
  ASSERT_TRUE(last->done);
  EXPECT_EQ(last->history.back().finished, requests);
  EXPECT_EQ(last->lanes.size(), kServingKeptEnded);
  // The newest ended ones: the highest ids (all arrived at once, FCFS).
  for (const Lane& l : last->lanes) {
    EXPECT_GE(l.seq, requests - int(kServingKeptEnded)) << "an old ended lane stayed";
    EXPECT_EQ(l.state, LaneState::Finished);
    EXPECT_FALSE(l.ids.empty());
  }
  auto replay = ServingReplay::open(rec);
  ASSERT_TRUE(replay.ok()) << replay.error().message;
  auto back = (*replay)->snapshot((*replay)->steps() - 1);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ((*back)->step, last->step);
  ASSERT_EQ((*back)->lanes.size(), last->lanes.size());
  for (size_t i = 0; i < last->lanes.size(); ++i) {
    EXPECT_EQ((*back)->lanes[i].seq, last->lanes[i].seq);
    EXPECT_EQ((*back)->lanes[i].ids, last->lanes[i].ids);
  }
  std::remove(rec.c_str());
}

// Speculative decoding in the run: the lanes carry the step's drafts from the scheduler's
// rows (the kept ones are then among the lane's tokens, the rest rolled back), the history
// counts them, and the pool still matches the engine's counts after every step.
TEST(ServingRun, SpeculativeDraftsReachTheLanes) {
  if (!have_model()) GTEST_SKIP() << kAbsent;
  ServingConfig c = small_config(40);
  c.workload.prompts = {{"def fib(n):\n    if n <= 1:\n        return n\n    return fib(n - 1) + "
                         "fib(n - 2)\n\ndef fib_memo(n, memo={}):\n    if n in memo:\n        "
                         "return memo[n]\n    if n <= 1:\n        return n\n",
                         false}};
  c.workload.arrival = "all";
  c.scheduler.speculation.kind = DraftKind::Ngram;
  c.scheduler.speculation.draft_max = 6;
  ServingRun run(engine_options());
  run.start(c, false);
  auto snaps = run_steps(run, 60);
  ASSERT_FALSE(snaps.empty());
  int drafted = 0, accepted = 0, rejected_steps = 0;
  size_t prev_len = 0;
  for (const auto& s : snaps) {
    ASSERT_EQ(s->lanes.size(), 1u);
    const Lane& l = s->lanes[0];
    const ServingPoint& p = s->history.back();
    EXPECT_EQ(p.drafted, int(l.drafted.size()));
    EXPECT_EQ(p.accepted, l.accepted);
    if (!l.drafted.empty()) {
      EXPECT_LE(l.accepted, int(l.drafted.size()));
      // The kept drafts are the lane's newest tokens but one (the model's own next token).
      ASSERT_GE(l.pieces.size(), size_t(l.accepted) + 1);
      for (int j = 0; j < l.accepted; ++j)
        EXPECT_EQ(l.pieces[l.pieces.size() - 1 - size_t(l.accepted) + size_t(j)],
                  l.drafted[size_t(j)]);
      if (l.state == LaneState::Running) {
        EXPECT_EQ(l.ids.size(), prev_len + size_t(l.accepted) + 1);
      }
      rejected_steps += l.accepted < int(l.drafted.size());
    }
    drafted += p.drafted;
    accepted += p.accepted;
    prev_len = l.ids.size();
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected_steps, 0);
  EXPECT_EQ(uint64_t(drafted), snaps.back()->totals.drafted);
  EXPECT_EQ(uint64_t(accepted), snaps.back()->totals.accepted);
}
