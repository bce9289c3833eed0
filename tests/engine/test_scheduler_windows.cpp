// test_scheduler_windows.cpp — a model with attention windows on the block pool: the tiny
// gemma3 (layers local, local, global; window 5) splits its layers into three groups of
// one layer, and the local groups give their blocks back once they fall outside the
// window. Shows:
//  - several sequences served together, each writing the tokens and the logits (bit for
//    bit) of the same prompt run alone through a Session whose local layers keep only
//    their window (the app's default cache);
//  - a long sequence's local groups hold at most the window's blocks while the global
//    group holds them all, and the pool's used blocks say so;
//  - a later prompt with the same start finds its blocks in the prefix cache (a local
//    group needs only those its window sees) and still writes its solo tokens;
//  - the pool's invariants after every step, and no block left in use at the end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "engine/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "tests/util/tiny_model.h"

namespace kvscope::test {
namespace {

std::shared_ptr<const Model> tiny_gemma() {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvscope_sched_win_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  TinyModelSpec spec = tiny_family("gemma3", 17);
  EXPECT_TRUE(write_tiny_model(spec, path).ok());
  auto m = Model::load(path);
  std::filesystem::remove(path);  // the mapping stays valid
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::shared_ptr<const Model>(std::move(m.value())) : nullptr;
}

std::vector<int32_t> prompt_of(int len, int seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t(4 + (i * 7 + seed * 13) % 200));
  return p;
}

struct Solo {
  std::vector<int32_t> tokens;
  std::vector<float> last_logits;
};

Solo run_alone(std::shared_ptr<const Model> model, const std::vector<int32_t>& prompt, int n) {
  SessionConfig sc;
  sc.max_tokens = n;
  sc.stop_at_eos = false;
  auto s = Session::create(model, make_cpu_backend(1), sc);
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE((*s)->reset_tokens(prompt).ok());
  Solo out;
  while (!(*s)->done()) {
    auto tr = (*s)->step();
    EXPECT_TRUE(tr.ok()) << tr.error().message;
    if (!tr.ok()) break;
    out.tokens.push_back(tr->token_id);
  }
  out.last_logits = (*s)->last_logits();
  return out;
}

TEST(SchedulerWindows, LocalGroupsGiveBlocksBackAndEverySequenceWritesItsSoloRun) {
  auto model = tiny_gemma();
  ASSERT_TRUE(model);
  auto backend = make_cpu_backend(1);
  SchedulerConfig cfg;
  cfg.block_size = 8;
  cfg.max_batch_tokens = 16;  // prompts longer than that go in chunks
  cfg.stop_at_eos = false;
  auto sched = Scheduler::create(model, *backend, cfg);
  ASSERT_TRUE(sched.ok()) << sched.error().message;
  Scheduler& s = **sched;
  const KvLayerGroups& g = s.layer_groups();
  ASSERT_EQ(g.count(), 3);
  ASSERT_EQ(g.size, 1);
  const int lens[] = {3, 40, 17, 9, 33};
  const int max_tokens = 24;
  for (int i = 0; i < 5; ++i) {
    Request r;
    r.prompt = prompt_of(lens[i], i);
    r.max_tokens = max_tokens;
    r.arrival_step = 1 + 2 * i;
    ASSERT_TRUE(s.add(r).ok());
  }
  int max_local_blocks = 0, steps = 0, max_given_back = 0;
  while (!s.idle() && steps < 500) {
    auto st = s.step();
    ASSERT_TRUE(st.ok()) << st.error().message;
    ++steps;
    Status ok = s.check();
    ASSERT_TRUE(ok.ok()) << "step " << st->step << ": " << ok.message();
    for (const StepRow& row : st->rows) {
      ASSERT_EQ(row.tables.size(), 3u);
      for (int grp = 0; grp < 3; ++grp) {
        int held = 0;
        max_given_back = std::max(
            max_given_back, int(row.tables[size_t(grp)].size()) -
                                int(std::count_if(row.tables[size_t(grp)].begin(),
                                                  row.tables[size_t(grp)].end(),
                                                  [](int32_t b) { return b >= 0; })));
        for (int32_t b : row.tables[size_t(grp)]) held += b >= 0;
        if (g.window[size_t(grp)] > 0) {
          max_local_blocks = std::max(max_local_blocks, held);
          // What a query at the sequence's length sees (4 earlier keys), plus a chunk.
          EXPECT_LE(held, kv_blocks_for(5 - 1 + cfg.max_batch_tokens, 8) + 1);
        } else {
          EXPECT_EQ(held, int(row.tables[size_t(grp)].size()));  // the global group keeps all
        }
      }
    }
  }
  ASSERT_TRUE(s.idle());
  EXPECT_EQ(s.pool().counts().used, 0);
  EXPECT_GE(max_local_blocks, 1);
  // The 40-token prompt and 24 tokens: 64 positions, 8 blocks; a local group keeps the
  // last one or two.
  EXPECT_GE(max_given_back, 6);
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE("sequence " + std::to_string(i));
    const Solo solo = run_alone(model, prompt_of(lens[i], i), max_tokens);
    EXPECT_EQ(s.generated(i), solo.tokens);
    const auto& got = s.last_logits(i);
    ASSERT_EQ(got.size(), solo.last_logits.size());
    EXPECT_EQ(std::memcmp(got.data(), solo.last_logits.data(), got.size() * sizeof(float)), 0);
  }
}

TEST(SchedulerWindows, ALaterPromptWithTheSameStartHitsThePrefixCacheInEveryGroup) {
  auto model = tiny_gemma();
  ASSERT_TRUE(model);
  auto backend = make_cpu_backend(1);
  SchedulerConfig cfg;
  cfg.block_size = 8;
  cfg.stop_at_eos = false;
  auto sched = Scheduler::create(model, *backend, cfg);
  ASSERT_TRUE(sched.ok()) << sched.error().message;
  Scheduler& s = **sched;
  std::vector<int32_t> shared = prompt_of(34, 3);
  std::vector<int32_t> second = shared;
  second.resize(32);
  for (int32_t t : {9, 10, 11}) second.push_back(t);
  Request a, b;
  a.prompt = shared;
  a.max_tokens = 6;
  b.prompt = second;
  b.max_tokens = 6;
  b.arrival_step = 20;  // after the first has finished
  ASSERT_TRUE(s.add(a).ok());
  ASSERT_TRUE(s.add(b).ok());
  int hit = -1;
  while (!s.idle()) {
    auto st = s.step();
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_TRUE(s.check().ok());
    for (const SchedEvent& e : st->events)
      if (e.kind == EventKind::PrefixHit && e.seq == 1) hit = e.n;
  }
  // Blocks 0..3 (32 positions) are common; a query at 32 sees keys 28..31 in the local
  // groups, so every group finds what it needs.
  EXPECT_EQ(hit, 32);
  EXPECT_EQ(s.pool().counts().used, 0);
  EXPECT_EQ(s.generated(1), run_alone(model, second, 6).tokens);
  EXPECT_EQ(s.generated(0), run_alone(model, shared, 6).tokens);
}

}  // namespace
}  // namespace kvscope::test
