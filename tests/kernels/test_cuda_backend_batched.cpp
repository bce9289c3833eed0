// test_cuda_backend_batched.cpp — batched decode steps of more sequences than the matvec
// kernels take (B > 8: the batched quantized GEMM) on paged caches of one pool, and their
// CUDA graphs, on the emulated CUDA backend against the CPU backend.
//
// Tolerances (test_cuda_backend.cpp's header): logits within kLogitTol of the CPU and of
// each sequence decoded alone (T = 1, the matvec kernels: another fp32 summation order).
// A graph replays the very launches an eager step issues, on the same inputs, so graph
// and eager steps must be bit-identical. Launch counts come from the emulator's counters:
// a graphed step is one cudaGraphLaunch and no direct kernel launch; a replay
// instantiates no graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "engine/scheduler.h"
#include "tests/kernels/cuda_parity_util.h"
#include "tests/util/tiny_model.h"
#if !defined(KVSCOPE_REAL_GPU_TEST)
#include "kernels/emu/emu.h"
#endif

namespace kvscope {
namespace {

int32_t argmax(const std::vector<float>& l) {
  return int32_t(std::max_element(l.begin(), l.end()) - l.begin());
}

// One backend's sequences: a pool, a paged cache per sequence.
struct Side {
  const char* label;
  Backend* be;
  bool together;  // false: every sequence alone in its own forward_batch
  std::shared_ptr<KvPool> pool;
  std::vector<std::unique_ptr<KvCache>> caches;
};

// Prompt i: distinct tokens, length 3 + (5 i) % 12 (3..14), except sequence 0's 17: the
// longest cache then spans 24 slots from the first decode step to the last of these tests,
// so the rows' attention grid (sized by the longest cache, rounded up to a power of two)
// stays one shape and a replay is possible from the second step on.
std::vector<std::vector<int32_t>> prompts(int n) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) {
    const int len = i == 0 ? 17 : 3 + (5 * i) % 12;
    std::vector<int32_t> t;
    for (int j = 0; j < len; ++j) t.push_back(int32_t(1 + (7 * i + 11 * j) % 120));
    p.push_back(std::move(t));
  }
  return p;
}

void prefill(Side& side, const Model& model, const KvCacheConfig& cfg,
             const std::vector<std::vector<int32_t>>& toks) {
  for (const auto& t : toks) {
    auto k = side.be->create_paged_kv_cache(cfg, side.pool);
    ASSERT_TRUE(k.ok()) << k.error().message;
    side.caches.push_back(std::move(*k));
    std::vector<BatchSeqOutput> out;
    Status st = forward_batch(*side.be, model,
                              {BatchSeq{side.caches.back().get(), t.data(), int(t.size())}}, out);
    ASSERT_TRUE(st.ok()) << side.label << ": " << st.message();
  }
}

// One decode step of sequences `which` (their next token: toks[i][cache length]).
void decode(Side& side, const Model& model, const std::vector<std::vector<int32_t>>& toks,
            const std::vector<int>& which, std::vector<BatchSeqOutput>& out) {
  std::vector<BatchSeq> batch;
  for (int i : which) {
    KvCache* c = side.caches[size_t(i)].get();
    batch.push_back(BatchSeq{c, toks[size_t(i)].data() + c->length(), 1});
  }
  out.clear();
  if (side.together) {
    Status st = forward_batch(*side.be, model, batch, out);
    ASSERT_TRUE(st.ok()) << side.label << ": " << st.message();
  } else {
    for (const BatchSeq& seq : batch) {
      std::vector<BatchSeqOutput> one;
      Status st = forward_batch(*side.be, model, {seq}, one);
      ASSERT_TRUE(st.ok()) << side.label << ": " << st.message();
      out.push_back(std::move(one[0]));
    }
  }
  for (int i : which) {
    if (side.caches[size_t(i)]->n_groups() > 1) {
      ASSERT_TRUE(side.caches[size_t(i)]->drop_outside_windows().ok());
    }
  }
}

std::unique_ptr<Backend> cuda_backend(const Model& model, bool graph) {
  CudaBackendOptions opt;
  opt.decode_graph = graph;
  auto be = make_cuda_backend(model, opt);
  EXPECT_TRUE(be.ok()) << be.error().message;
  return be.ok() ? std::move(*be) : nullptr;
}

// B sequences of prompts(B), 4 decode steps with every sequence's row in one
// forward_batch: the CUDA batch with graphs equals the CUDA batch without (bit for bit),
// the CPU batch and each sequence decoded alone (within kLogitTol); from the second
// step on, each graphed step is one graph launch and a replay.
void check_batch(const Model& model, int B) {
  SCOPED_TRACE("B " + std::to_string(B));
  const KvCacheConfig cfg = kv_cache_config(model, {}, KvPolicy::Full);
  const KvLayerGroups groups = kv_layer_groups(cfg);
  const KvPoolConfig pc{
      {groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim}, cfg.types, 8, groups.count() * 4 * B};
  auto cpu = make_cpu_backend(1);
  auto graph = cuda_backend(model, true), eager = cuda_backend(model, false),
       alone = cuda_backend(model, false);
  ASSERT_TRUE(graph && eager && alone);
  Side sides[4] = {{"cpu batch", cpu.get(), true, {}, {}},
                   {"cuda graph batch", graph.get(), true, {}, {}},
                   {"cuda eager batch", eager.get(), true, {}, {}},
                   {"cuda alone", alone.get(), false, {}, {}}};
  std::vector<std::vector<int32_t>> toks = prompts(B);
  for (Side& side : sides) {
    auto p = side.be->create_kv_pool(pc);
    ASSERT_TRUE(p.ok()) << p.error().message;
    side.pool = *p;
    prefill(side, model, cfg, toks);
  }
  std::vector<int> all(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) all[size_t(i)] = i;
  // The first decode token of every sequence: a fixed one (the tests compare sides, not
  // the model's choices); later ones the CPU batch's greedy choice, fed to every side.
  for (auto& t : toks) t.push_back(int32_t(5 + t.size()));
  for (int step = 0; step < 4; ++step) {
    std::vector<BatchSeqOutput> out[4];
    for (int s = 0; s < 4; ++s) {
#if !defined(KVSCOPE_REAL_GPU_TEST)
      const uint64_t direct0 = emu::direct_kernel_launches(), graphs0 = emu::graph_launches(),
                     inst0 = emu::graphs_instantiated();
#endif
      decode(sides[s], model, toks, all, out[s]);
      if (::testing::Test::HasFatalFailure()) return;
#if !defined(KVSCOPE_REAL_GPU_TEST)
      if (s == 1 && step > 0) {
        EXPECT_EQ(emu::direct_kernel_launches() - direct0, 0u) << "step " << step;
        EXPECT_EQ(emu::graph_launches() - graphs0, 1u) << "step " << step;
        EXPECT_EQ(emu::graphs_instantiated() - inst0, 0u) << "step " << step << ": a replay";
      }
#endif
    }
    for (int i = 0; i < B; ++i) {
      const auto& ref = out[0][size_t(i)].logits;
      const auto& got = out[1][size_t(i)].logits;
      EXPECT_EQ(got, out[2][size_t(i)].logits)
          << "step " << step << " seq " << i << ": graph vs eager";
      EXPECT_LE(max_abs_diff(ref, got), kLogitTol) << "step " << step << " seq " << i << ": vs cpu";
      EXPECT_LE(max_abs_diff(out[3][size_t(i)].logits, got), kLogitTol)
          << "step " << step << " seq " << i << ": vs alone";
      if (top2_margin(ref) > 2 * kLogitTol) {
        EXPECT_EQ(argmax(got), argmax(ref)) << "step " << step << " seq " << i;
      }
      toks[size_t(i)].push_back(argmax(ref));
    }
  }
  for (Side& side : sides) {
    std::vector<const std::vector<int32_t>*> tables;
    for (auto& c : side.caches)
      for (int g = 0; g < c->n_groups(); ++g) tables.push_back(&c->blocks(g));
    Status st = side.pool->check(tables);
    EXPECT_TRUE(st.ok()) << side.label << ": " << st.message();
  }
}

class CudaBatchedDecode : public CudaBackendParity {};

TEST_F(CudaBatchedDecode, ThreeNineSixteenSequencesEqualEachAloneEagerAndCpu) {
  // B = 3 goes through the matvec kernels, 9 and 16 through the batched GEMM.
  test::TinyModelSpec spec;
  spec.seed = 17;
  std::shared_ptr<const Model> llama = load_tiny(spec, "batched");
  ASSERT_TRUE(llama);
  for (int B : {3, 9, 16}) {
    check_batch(*llama, B);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_F(CudaBatchedDecode, NonNativeWeightsAndWindowedGroups) {
  // F16 matrices (no native matvec: alone they use the fp32 copy, batched the GEMM on
  // the stored halves) and Gemma 3's windowed cache groups, at B = 9.
  test::TinyModelSpec spec;
  spec.seed = 23;
  spec.matrix_type = GgmlType::F16;
  std::shared_ptr<const Model> f16 = load_tiny(spec, "batchedf16");
  ASSERT_TRUE(f16);
  check_batch(*f16, 9);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string path = tiny_path("batchedwin");
  ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 29), path).ok());
  auto gemma = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(gemma.ok()) << gemma.error().message;
  check_batch(**gemma, 9);
}

#if !defined(KVSCOPE_REAL_GPU_TEST)
// Sequences join and leave: each batch size gets its own graph, captured once; a batch of
// a size seen before replays its graph even when its sequences differ. Every step equals
// the same schedule run eagerly, bit for bit.
TEST_F(CudaBatchedDecode, JoiningAndLeavingSwitchGraphsAndStayExact) {
  test::TinyModelSpec spec;
  spec.seed = 31;
  std::shared_ptr<const Model> model = load_tiny(spec, "joinleave");
  ASSERT_TRUE(model);
  const KvCacheConfig cfg = kv_cache_config(*model, {}, KvPolicy::Full);
  const int N = 12;
  const KvPoolConfig pc{cfg.shape, cfg.types, 8, 4 * N};
  auto graph = cuda_backend(*model, true), eager = cuda_backend(*model, false);
  ASSERT_TRUE(graph && eager);
  Side sides[2] = {{"graph", graph.get(), true, {}, {}}, {"eager", eager.get(), true, {}, {}}};
  std::vector<std::vector<int32_t>> toks = prompts(N);
  for (Side& side : sides) {
    auto p = side.be->create_kv_pool(pc);
    ASSERT_TRUE(p.ok()) << p.error().message;
    side.pool = *p;
    prefill(side, *model, cfg, toks);
  }
  for (auto& t : toks)
    for (int j = 0; j < 8; ++j) t.push_back(int32_t(3 + (t.size() * 13) % 100));
  // Sequence 0 (the longest) stays; the others come and go. Expected: the first step of
  // a batch size captures a graph; a size seen before replays.
  struct Step {
    std::vector<int> which;
    bool capture;
  };
  // The largest batch comes first: it sizes the scratch memory, which then never moves
  // (a moved buffer would rightly key a new graph).
  // Seven steps: sequence 0's cache stays within 32 slots (the attention grid's size).
  const std::vector<Step> plan = {
      {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, true},     // B 10: first
      {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, false},    // B 10 again: replay
      {{0, 1, 2, 4, 5, 6, 7, 8, 9}, true},        // 3 leaves: B 9, a new graph
      {{0, 2, 4, 5, 6, 7, 8, 9}, true},           // 1 leaves: B 8, a new graph
      {{0, 2, 4, 5, 6, 7, 8, 9, 10, 11}, false},  // 10 and 11 join: B 10, other sequences
      {{0, 2, 4, 5, 6, 7, 9, 10, 11}, false},     // 8 leaves: B 9 again
      {{0, 4, 5, 6, 7, 9, 10, 11}, false},        // 2 leaves: B 8 again
  };

  for (size_t k = 0; k < plan.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k) + " B " + std::to_string(plan[k].which.size()));
    std::vector<BatchSeqOutput> out_graph, out_eager;
    const uint64_t direct0 = emu::direct_kernel_launches(), graphs0 = emu::graph_launches(),
                   inst0 = emu::graphs_instantiated();
    decode(sides[0], *model, toks, plan[k].which, out_graph);
    if (::testing::Test::HasFatalFailure()) return;
    if (k > 0) {  // step 0 may grow the attention work memory mid-step (then partly eager)
      EXPECT_EQ(emu::direct_kernel_launches() - direct0, 0u);
      EXPECT_EQ(emu::graph_launches() - graphs0, 1u);
      EXPECT_EQ(emu::graphs_instantiated() - inst0, plan[k].capture ? 1u : 0u);
    }
    decode(sides[1], *model, toks, plan[k].which, out_eager);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(out_graph.size(), out_eager.size());
    for (size_t i = 0; i < out_graph.size(); ++i)
      EXPECT_EQ(out_graph[i].logits, out_eager[i].logits) << "row " << i;
  }
}
#endif

#if !defined(KVSCOPE_REAL_GPU_TEST)
// Host work of a decode step on paged caches. On a GPU every copy from host memory is a
// driver call, and every allocation another (its cudaFree later waits for the device):
// with 64 sequences in a batch, a copy and an allocation per layer for each new block were
// host time the GPU waited through. B sequences decode in lockstep over blocks of 8, so
// on every 8th step each of them takes a new block. Then a step copies at most one table
// refresh per sequence from the host (besides the step's parameters, its only copy on the
// other steps) and allocates at most once per sequence (and once for the attention's work
// memory), whatever the number of layers; a new block inside the slots already laid out on
// the device allocates nothing. Every
// row's logits stay the CPU backend's (within kLogitTol), so the device's tables and slot
// maps stayed right.
TEST_F(CudaBatchedDecode, NewBlocksCostOneCopyPerSequenceNotOnePerLayer) {
  test::TinyModelSpec spec;
  spec.seed = 37;
  spec.n_layer = 6;
  std::shared_ptr<const Model> model = load_tiny(spec, "hostcopies");
  ASSERT_TRUE(model);
  const KvCacheConfig cfg = kv_cache_config(*model, {}, KvPolicy::Full);
  const int B = 4, kPrompt = 5, kLast = 32, kBlock = 8;
  const KvPoolConfig pc{cfg.shape, cfg.types, kBlock, B * 8};
  auto cpu = make_cpu_backend(1);
  auto graph = cuda_backend(*model, true);
  ASSERT_TRUE(graph);
  Side sides[2] = {{"cuda", graph.get(), true, {}, {}}, {"cpu", cpu.get(), true, {}, {}}};
  std::vector<std::vector<int32_t>> toks;
  for (int i = 0; i < B; ++i) {
    std::vector<int32_t> t;
    for (int j = 0; j <= kLast; ++j) t.push_back(int32_t(1 + (7 * i + 11 * j) % 120));
    toks.push_back(std::move(t));
  }
  std::vector<std::vector<int32_t>> prompt_toks;
  for (const auto& t : toks) prompt_toks.emplace_back(t.begin(), t.begin() + kPrompt);
  for (Side& side : sides) {
    auto p = side.be->create_kv_pool(pc);
    ASSERT_TRUE(p.ok()) << p.error().message;
    side.pool = *p;
    prefill(side, *model, cfg, prompt_toks);
  }
  std::vector<int> all(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) all[size_t(i)] = i;
  int new_block_steps = 0, without_allocation = 0;
  for (int pos = kPrompt; pos <= kLast; ++pos) {
    SCOPED_TRACE("position " + std::to_string(pos));
    std::vector<BatchSeqOutput> out[2];
    const uint64_t copies0 = emu::host_copies_to_device(), allocs0 = emu::device_allocations();
    decode(sides[0], *model, toks, all, out[0]);
    if (::testing::Test::HasFatalFailure()) return;
    const uint64_t copies = emu::host_copies_to_device() - copies0,
                   allocs = emu::device_allocations() - allocs0;
    if (pos % kBlock == 0) {  // every sequence took a block
      ++new_block_steps;
      without_allocation += allocs == 0;
      EXPECT_LE(copies, uint64_t(1 + B));
      // One more when the longest cache doubles: the attention's work memory.
      EXPECT_LE(allocs, uint64_t(B + 1));
    } else if (pos > kPrompt) {  // the first step also sets up its graph
      EXPECT_LE(copies, 1u);
      EXPECT_EQ(allocs, 0u);
    }
    decode(sides[1], *model, toks, all, out[1]);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_EQ(out[0].size(), out[1].size());
    for (size_t i = 0; i < out[0].size(); ++i) {
      EXPECT_LE(max_abs_diff(out[1][i].logits, out[0][i].logits), kLogitTol) << "row " << i;
      if (top2_margin(out[1][i].logits) > 2 * kLogitTol) {
        EXPECT_EQ(argmax(out[0][i].logits), argmax(out[1][i].logits)) << "row " << i;
      }
    }
  }
  EXPECT_EQ(new_block_steps, 4);
  EXPECT_GE(without_allocation, 1) << "a new block inside the slots laid out allocates nothing";
  std::vector<const std::vector<int32_t>*> tables;
  for (auto& c : sides[0].caches) tables.push_back(&c->blocks(0));
  Status st = sides[0].pool->check(tables);
  EXPECT_TRUE(st.ok()) << st.message();
}

// Copy-on-write of a block (a fork writing into a block it shares) is one launch over every
// layer's K and V, not a device copy per layer, side and kv head made from the host
// (180 calls for SmolLM2); so are a context shift's row moves (there a copy per move,
// layer, side and head). The copied rows are checked against the CPU in
// CudaBackendParity.PagedBatchMatchesCpu and the shift tests, the kernels byte for byte
// in test_kernel_kv_copy_block.
TEST_F(CudaBatchedDecode, ABlockCopyAndAShiftsMovesAreOneLaunchEach) {
  test::TinyModelSpec spec;
  spec.n_layer = 4;
  std::shared_ptr<const Model> model = load_tiny(spec, "copyblock");
  ASSERT_TRUE(model);
  auto be = cuda_backend(*model, false);
  ASSERT_TRUE(be);
  const KvCacheConfig cfg = kv_cache_config(*model, {}, KvPolicy::Full);
  auto pool = be->create_kv_pool(KvPoolConfig{cfg.shape, cfg.types, 16, 4});
  ASSERT_TRUE(pool.ok()) << pool.error().message;
  const uint64_t launches0 = emu::direct_kernel_launches(), kernels0 = emu::kernels_run();
  ASSERT_TRUE((*pool)->copy_block(2, 0).ok());
  EXPECT_EQ(emu::direct_kernel_launches() - launches0, 1u);
  EXPECT_EQ(emu::kernels_run() - kernels0, 1u);
  EXPECT_FALSE((*pool)->copy_block(4, 0).ok());
  // A context shift's row moves: one upload of the moves and one launch.
  const uint64_t launches1 = emu::direct_kernel_launches(), copies1 = emu::host_copies_to_device();
  ASSERT_TRUE((*pool)->move_rows({{0, 20, 4}, {4, 36, 8}, {16, 48, 5}}).ok());
  EXPECT_EQ(emu::direct_kernel_launches() - launches1, 1u);
  EXPECT_EQ(emu::host_copies_to_device() - copies1, 1u);
}
#endif

// The scheduler on CUDA samples where the logits live: a step's decode rows go through one
// pass of the device sampler and only their candidates come back. Its tokens must be the
// host path's, token for token, for greedy and for seeded temperature / top-k / top-p /
// min-p sequences in one batch; and the device must have settled most rows (else the
// comparison proves little). Steps with held-back end tokens (min_tokens), penalties or
// log-probabilities keep the host path.
TEST_F(CudaBatchedDecode, SchedulerSamplesOnTheDeviceWithTheHostsTokens) {
  test::TinyModelSpec spec;
  spec.seed = 41;
  std::shared_ptr<const Model> model = load_tiny(spec, "devsample");
  ASSERT_TRUE(model);
  const int N = 12;
  std::vector<std::vector<int32_t>> toks = prompts(N);
  const auto run = [&](bool device, SchedulerStats* stats) {
    std::vector<std::vector<int32_t>> gen;
    auto be = cuda_backend(*model, true);
    if (!be) return gen;
    SchedulerConfig c;
    c.block_size = 8;
    c.max_seqs = N;
    c.stop_at_eos = false;
    c.device_sampling = device;
    auto s = Scheduler::create(model, *be, c);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    if (!s.ok()) return gen;
    for (int i = 0; i < N; ++i) {
      Request r;
      r.prompt = toks[size_t(i)];
      r.max_tokens = 8;
      r.sampler.seed = uint64_t(100 + i);
      switch (i % 6) {
        case 0:
          break;  // greedy
        case 1:
          r.sampler.temperature = 0.8f;
          r.sampler.top_k = 20;
          break;
        case 2:
          r.sampler.temperature = 0.8f;
          r.sampler.top_p = 0.9f;
          break;
        case 3:
          r.sampler.temperature = 0.8f;
          r.sampler.min_p = 0.05f;
          break;
        case 4:
          r.min_tokens = 3;
          break;  // held back for 3 tokens: the host path
        case 5:
          r.logprobs = 2;
          break;  // the whole row: the host path
      }
      auto id = (*s)->add(r);
      EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.error().message);
    }
    while (!(*s)->idle()) {
      auto st = (*s)->step();
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
      if (!st.ok()) return gen;
    }
    for (int i = 0; i < N; ++i) gen.push_back((*s)->generated(i));
    *stats = (*s)->stats();
    return gen;
  };
  SchedulerStats on, off;
  const auto dev = run(true, &on), host = run(false, &off);
  ASSERT_EQ(dev.size(), size_t(N));
  ASSERT_EQ(host.size(), size_t(N));
  for (int i = 0; i < N; ++i) {
    EXPECT_EQ(dev[size_t(i)].size(), 8u) << "sequence " << i;
    EXPECT_EQ(dev[size_t(i)], host[size_t(i)]) << "sequence " << i;
  }
  EXPECT_EQ(off.device_sampled, 0u);
  // Sequences 0-3 and 6-9 sample on the device at each of their 8 tokens, sequence 4 and
  // 10 at their last 5.
  EXPECT_EQ(on.device_sampled, uint64_t(8 * 8 + 2 * 5));
  // The tiny model's distributions are flat, so a top-p or min-p cut often needs more
  // candidates than the device returns (those rows come back whole); greedy and top-k
  // rows settle: at least half of all.
  EXPECT_GE(2 * (on.device_sampled - on.device_fallbacks), on.device_sampled)
      << on.device_fallbacks << " of " << on.device_sampled << " rows came back whole";
}

}  // namespace
}  // namespace kvscope
