// test_cuda_backend_persistent.cpp — the persistent decode step (CudaBackendOptions::
// persistent, kernels/decode_persistent.cu) against the usual graphed decode step.
//
// Built twice: test_cuda_backend_persistent on the emulator (every CI run), and
// test_cuda_backend_persistent_gpu (KVSCOPE_REAL_GPU_TEST) on a real GPU, skipping where
// none is usable.
//
// The persistent kernel runs the very device bodies of the graphed step's kernels with the
// same per-item thread mapping (only the order in which blocks take items differs, and no
// result depends on it), so on the emulator its logits are asserted BIT-EQUAL to the
// graphed path's, and the greedy tokens equal, over 16 decode steps; whatever the grid
// size. On a GPU nvcc may contract a*b+c differently where a body is inlined into another
// kernel, so there the logits are held to kLogitTol and the tokens to equality.
// Launches per step with it on (emulator): from the second decode step on (the first
// allocates the attention's work memory, which flushes its recording: it runs as recorded),
// exactly 1 kernel launch (a cooperative one: the
// embedding, every layer with its attention rows and K/V norms, the final norm and the LM
// head), no graph launch. Steps the kernel does not cover (a f32 cache, a windowed model)
// run as before: the same results and no cooperative launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/model.h"
#include "tests/kernels/cuda_parity_util.h"
#include "tests/util/sanitizer.h"
#include "tests/util/tiny_model.h"
#if !defined(KVSCOPE_REAL_GPU_TEST)
#include "kernels/emu/emu.h"
#endif

namespace kvscope {
namespace {

struct Steps {
  std::vector<std::vector<float>> logits;                      // [decode step][V]
  std::vector<int32_t> tokens;                                 // greedy choice after each step
  std::vector<uint64_t> kernels, cooperative, direct, graphs;  // per decode step (emulator)
  std::string name;
};

// A prompt of `prompt` tokens (at most 5), then n greedy decode steps through forward()
// (the bench's path), on a paged cache (the default) or a contiguous one. A prompt of one
// token is itself a decode step (the first, counted in n).
Steps decode_steps(const Model& model, const CudaBackendOptions& opt, int n, bool paged,
                   KvDtype dtype = KvDtype::F16, int prompt = 5) {
  Steps r;
  auto be = make_cuda_backend(model, opt);
  EXPECT_TRUE(be.ok()) << be.error().message;
  if (!be.ok()) return r;
  Backend& b = **be;
  r.name = b.name();
  const KvTypes types{dtype, dtype};
  const KvCacheConfig cfg = kv_cache_config(model, types, KvPolicy::Full);
  std::shared_ptr<KvPool> pool;
  Expected<std::unique_ptr<KvCache>> cache = make_error("no cache");
  if (paged) {
    const KvLayerGroups groups = kv_layer_groups(cfg);
    KvPoolConfig pc{{groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim}, types, 16, 0};
    pc.n_blocks = kv_blocks_for(5 + n + 1, 16) * groups.count();
    auto p = b.create_kv_pool(pc);
    EXPECT_TRUE(p.ok()) << p.error().message;
    if (!p.ok()) return r;
    pool = *p;
    cache = b.create_paged_kv_cache(cfg, pool);
  } else {
    cache = b.create_kv_cache(cfg, 64);  // no growth (that flushes a step) during the run
  }
  EXPECT_TRUE(cache.ok()) << cache.error().message;
  if (!cache.ok()) return r;
  std::vector<int32_t> tokens = {1, 40, 41, 72, 100};
  tokens.resize(size_t(prompt));
  ForwardOutput out;
  Status s = Status::Ok();
  if (prompt > 1) {
    s = forward(b, model, tokens.data(), prompt, 0, **cache, out);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  for (int i = 0; i < n && s.ok(); ++i) {
    const int pos = int(tokens.size()) - (i == 0 && prompt == 1 ? 1 : 0);
    if (i > 0 || prompt > 1)
      tokens.push_back(
          int32_t(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin()));
#if !defined(KVSCOPE_REAL_GPU_TEST)
    const uint64_t k0 = kvscope::emu::kernels_run(), c0 = kvscope::emu::cooperative_kernels_run(),
                   d0 = kvscope::emu::direct_kernel_launches(), g0 = kvscope::emu::graph_launches();
#endif
    s = forward(b, model, tokens.data() + pos, 1, pos, **cache, out);
    EXPECT_TRUE(s.ok()) << s.message();
#if !defined(KVSCOPE_REAL_GPU_TEST)
    r.kernels.push_back(kvscope::emu::kernels_run() - k0);
    r.cooperative.push_back(kvscope::emu::cooperative_kernels_run() - c0);
    r.direct.push_back(kvscope::emu::direct_kernel_launches() - d0);
    r.graphs.push_back(kvscope::emu::graph_launches() - g0);
#endif
    r.logits.push_back(out.logits);
    r.tokens.push_back(
        int32_t(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin()));
  }
  return r;
}

CudaBackendOptions persistent_on(int blocks = 0) {
  CudaBackendOptions o;
  o.persistent = true;
  o.persistent_blocks = blocks;
  return o;
}

// Persistent against graphed: equal tokens, logits bit-equal on the emulator (within
// kLogitTol on a GPU).
void expect_same_steps(const Steps& graphed, const Steps& persistent, int n) {
  ASSERT_EQ(graphed.logits.size(), size_t(n));
  ASSERT_EQ(persistent.logits.size(), size_t(n));
  float worst = 0;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(graphed.tokens[size_t(i)], persistent.tokens[size_t(i)]) << "step " << i;
    worst = std::max(worst, max_abs_diff(graphed.logits[size_t(i)], persistent.logits[size_t(i)]));
#if defined(KVSCOPE_REAL_GPU_TEST)
    EXPECT_LE(max_abs_diff(graphed.logits[size_t(i)], persistent.logits[size_t(i)]), kLogitTol)
        << "step " << i;
#else
    EXPECT_EQ(graphed.logits[size_t(i)], persistent.logits[size_t(i)]) << "step " << i;
#endif
  }
  std::printf("[ INFO     ] %s: largest logit difference %.3g over %d steps\n",
              persistent.name.c_str(), worst, n);
}

#if defined(KVSCOPE_REAL_GPU_TEST)
void expect_one_launch_per_step(const Steps&) {}
void expect_no_persistent_step(const Steps&) {}
#else
// Each decode step but the first (see the top): one kernel, the cooperative one, launched
// directly; no graph.
void expect_one_launch_per_step(const Steps& s) {
  EXPECT_GE(s.kernels.size(), 2u);
  for (size_t i = 1; i < s.kernels.size(); ++i) {
    EXPECT_EQ(s.kernels[i], 1u) << "step " << i;
    EXPECT_EQ(s.cooperative[i], 1u) << "step " << i;
    EXPECT_EQ(s.direct[i], 1u) << "step " << i;
    EXPECT_EQ(s.graphs[i], 0u) << "step " << i;
  }
}
void expect_no_persistent_step(const Steps& s) {
  for (size_t i = 0; i < s.cooperative.size(); ++i) EXPECT_EQ(s.cooperative[i], 0u) << "step " << i;
}
#endif

bool name_says_persistent(const std::string& name) {
  return name.find(", persistent step") != std::string::npos;
}

TEST_F(CudaBackendParity, PersistentStepEqualsGraphedOnTinyLlamaSixteenSteps) {
  test::TinyModelSpec spec;
  spec.seed = 23;
  spec.n_embd = 96;  // head_dim 24: the attention's 128-thread bodies with G = 5
  spec.n_layer = 3;
  std::shared_ptr<const Model> model = load_tiny(spec, "persistent");
  ASSERT_TRUE(model);
  for (bool paged : {true, false}) {  // the bench's paged cache, 16 steps; a contiguous one
    SCOPED_TRACE(paged ? "paged cache" : "contiguous cache");
    // Under ASan (30 to 60 times slower) 6 steps: the same code, the release stage runs 16.
    const int n = paged && !test::kAddressSanitizer ? 16 : 6;
    const Steps graphed = decode_steps(*model, CudaBackendOptions{}, n, paged);
    const Steps persistent = decode_steps(*model, persistent_on(), n, paged);
    EXPECT_FALSE(name_says_persistent(graphed.name)) << graphed.name;
    EXPECT_TRUE(name_says_persistent(persistent.name)) << persistent.name;
    expect_same_steps(graphed, persistent, n);
    expect_one_launch_per_step(persistent);
  }
}

// Any resident grid computes the same (grid-stride loops over every phase's items): three
// blocks, one block and every block that fits give the same logits.
TEST_F(CudaBackendParity, PersistentStepDoesNotDependOnTheGridSize) {
  test::TinyModelSpec spec;
  spec.seed = 5;
  std::shared_ptr<const Model> model = load_tiny(spec, "persistent_grid");
  ASSERT_TRUE(model);
  const Steps all = decode_steps(*model, persistent_on(), 6, true);
  for (int blocks : {1, 3}) {
    SCOPED_TRACE(std::to_string(blocks) + " blocks");
    const Steps few = decode_steps(*model, persistent_on(blocks), 6, true);
    expect_same_steps(all, few, 6);
    expect_one_launch_per_step(few);
  }
}

// The default model (SmolLM2-135M Q4_1: 30 layers, C = 576, 9 heads of 64, 3 kv heads,
// tied Q8_0 LM head of 49,152 rows): two decode steps from an empty cache (the second one
// persistent), against graphed. Four emulated forwards of 135M parameters: ~15 s.
TEST_F(CudaBackendParity, PersistentStepEqualsGraphedOnTheDefaultModel) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL))
    GTEST_SKIP() << "default model absent: run scripts/fetch_model.sh";
  auto m = Model::load(KVSCOPE_DEFAULT_MODEL);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Steps graphed = decode_steps(**m, CudaBackendOptions{}, 2, true, KvDtype::F16, 1);
  const Steps persistent = decode_steps(**m, persistent_on(), 2, true, KvDtype::F16, 1);
  expect_same_steps(graphed, persistent, 2);
  expect_one_launch_per_step(persistent);
}

// Steps the kernel does not cover take the usual path, per step, with the same results:
// a f32 cache and a windowed model (Gemma 3).
TEST_F(CudaBackendParity, PersistentStepFallsBackWhereItDoesNotApply) {
  test::TinyModelSpec spec;
  spec.seed = 29;
  std::shared_ptr<const Model> llama = load_tiny(spec, "persistent_fallback");
  ASSERT_TRUE(llama);
  {
    SCOPED_TRACE("f32 cache");
    const Steps graphed = decode_steps(*llama, CudaBackendOptions{}, 4, true, KvDtype::F32);
    const Steps persistent = decode_steps(*llama, persistent_on(), 4, true, KvDtype::F32);
    expect_same_steps(graphed, persistent, 4);
    expect_no_persistent_step(persistent);
  }
  {
    SCOPED_TRACE("gemma3 (windows, post norms)");
    const std::string path = tiny_path("persistent_gemma3");
    ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 3), path).ok());
    auto g = Model::load(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(g.ok()) << g.error().message;
    const Steps graphed = decode_steps(**g, CudaBackendOptions{}, 4, true);
    const Steps persistent = decode_steps(**g, persistent_on(), 4, true);
    expect_same_steps(graphed, persistent, 4);
    expect_no_persistent_step(persistent);
  }
}

// A session (the app's path: prompt, decode steps with attention rows and K/V norms for
// the scene, sampling on the device) gives the same tokens, logits and attention rows
// with the persistent step, which its decode steps take.
TEST_F(CudaBackendParity, PersistentStepSessionEqualsGraphed) {
  test::TinyModelSpec spec;
  spec.seed = 31;
  std::shared_ptr<const Model> llama = load_tiny(spec, "persistent_session");
  ASSERT_TRUE(llama);
  {
#if !defined(KVSCOPE_REAL_GPU_TEST)
    const uint64_t c0 = kvscope::emu::cooperative_kernels_run();
#endif
    auto a = make_cuda_backend(*llama);
    auto b = make_cuda_backend(*llama, persistent_on());
    ASSERT_TRUE(a.ok() && b.ok());
    RunResult ra = run_session(llama, std::move(a.value()), CacheMode::Cache, 6);
    RunResult rb = run_session(llama, std::move(b.value()), CacheMode::Cache, 6);
    ASSERT_EQ(ra.steps.size(), 6u);
    ASSERT_EQ(rb.steps.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(ra.steps[i].token_id, rb.steps[i].token_id) << "step " << i;
      EXPECT_EQ(ra.logits[i], rb.logits[i]) << "step " << i;
      EXPECT_EQ(ra.steps[i].attention, rb.steps[i].attention) << "step " << i;
      EXPECT_EQ(ra.steps[i].k_norm, rb.steps[i].k_norm) << "step " << i;
      EXPECT_EQ(ra.steps[i].v_norm, rb.steps[i].v_norm) << "step " << i;
    }
#if !defined(KVSCOPE_REAL_GPU_TEST)
    EXPECT_EQ(kvscope::emu::cooperative_kernels_run() - c0, 4u);  // decode steps 2 to 5
#endif
  }
}

#if !defined(KVSCOPE_REAL_GPU_TEST)
// KVSCOPE_CUDA_PERSISTENT=1 turns it on like the option; off by default; the name says so.
TEST_F(CudaBackendParity, PersistentStepByEnvironmentAndOffByDefault) {
  test::TinyModelSpec spec;
  std::shared_ptr<const Model> model = load_tiny(spec, "persistent_env");
  ASSERT_TRUE(model);
  {
    auto be = make_cuda_backend(*model);
    ASSERT_TRUE(be.ok());
    EXPECT_FALSE(name_says_persistent((*be)->name())) << (*be)->name();
  }
  const char* prev = std::getenv("KVSCOPE_CUDA_PERSISTENT");
  const std::string saved = prev ? prev : "";
  setenv("KVSCOPE_CUDA_PERSISTENT", "1", 1);
  const Steps s = decode_steps(*model, CudaBackendOptions{}, 2, true);
  if (prev)
    setenv("KVSCOPE_CUDA_PERSISTENT", saved.c_str(), 1);
  else
    unsetenv("KVSCOPE_CUDA_PERSISTENT");
  EXPECT_TRUE(name_says_persistent(s.name)) << s.name;
  expect_one_launch_per_step(s);
  // Without the decode graph there is no recorded step to replace: off.
  CudaBackendOptions no_graph = persistent_on();
  no_graph.decode_graph = false;
  const Steps eager = decode_steps(*model, no_graph, 2, true);
  EXPECT_FALSE(name_says_persistent(eager.name)) << eager.name;
  expect_no_persistent_step(eager);
}
#endif

}  // namespace
}  // namespace kvscope
