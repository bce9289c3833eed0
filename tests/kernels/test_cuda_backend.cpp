// test_cuda_backend.cpp — the whole CUDA backend against the CPU backend.
//
// Built twice from this file: test_cuda_backend runs the backend on the CPU emulation
// layer (every CI run); test_cuda_backend_gpu (KVSCOPE_REAL_GPU_TEST) runs it on a real
// GPU and skips with the probe's message where none is usable.
//
// Tolerances: every product keeps fp32 activations and exact weights (the quantized
// matvec kernels for Q4_1/Q8_0, otherwise an fp32 dequantized copy; the batched quantized
// GEMM for 9..64 rows and cuBLAS fp32 GEMMs past that), so the only differences from the CPU are
// fp32 summation order and rsqrt/exp/tanh: logits agree to ~1e-4 (measured up to 6e-5 on
// the tiny models); kLogitTol = 2e-3 absolute leaves room for that over a few layers.
// Attention probabilities are softmax outputs in [0, 1]: kProbTol = 2e-4.
//  - FLOP counters come from the shared forward, so they must match exactly.
//  - Tokens: greedy choices must match except where the CPU's best two logits are within
//    the logit tolerance of each other (a tie the allowed noise could flip).
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>

#include <cuda_runtime.h>

#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/forward.h"
#include "engine/model.h"
#include "engine/session.h"
#include "tests/kernels/cuda_parity_util.h"
#include "tests/util/sanitizer.h"
#include "tests/util/tiny_model.h"
#if !defined(KVSCOPE_REAL_GPU_TEST)
#include "kernels/emu/emu.h"
#endif

namespace kvscope {
namespace {

// forward() directly: a prompt of `prompt_len` tokens (> 8: cuBLAS path) then
// single-token steps (matvec path).
void check_forward_parity(const Model& model, KvDtype dtype, int prompt_len) {
  auto cuda = make_cuda_backend(model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  auto cpu = make_cpu_backend(1);
  // What a second backend like each is made with (StepSource::twin): kind and CPU threads.
  EXPECT_STREQ((*cuda)->kind(), "cuda");
  EXPECT_EQ((*cuda)->threads(), 0);
  EXPECT_STREQ(cpu->kind(), "cpu");
  EXPECT_EQ(cpu->threads(), 1);
  const ModelConfig& c = model.config();
  const KvShape shape{c.n_layer, c.n_head_kv, c.head_dim};
  auto cache_cpu = cpu->create_kv_cache(kv_config_full(shape, {dtype, dtype}), 4);
  auto cache_gpu = (*cuda)->create_kv_cache(kv_config_full(shape, {dtype, dtype}), 4);  // grows during the test
  ASSERT_TRUE(cache_cpu.ok() && cache_gpu.ok());
  std::vector<int32_t> tokens = {1, 40, 41, 72, 100, 101, 102, 33, 3, 90, 91, 92};
  tokens.resize(size_t(prompt_len));
  for (int step = 0; step < 4; ++step) {
    const int pos0 = (*cache_cpu)->length();
    const int T = step == 0 ? int(tokens.size()) : 1;
    ForwardOutput a, b;
    ASSERT_TRUE(forward(*cpu, model, tokens.data() + pos0, T, pos0, **cache_cpu, a).ok());
    Status s = forward(**cuda, model, tokens.data() + pos0, T, pos0, **cache_gpu, b);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_LE(max_abs_diff(a.logits, b.logits), kLogitTol) << "step " << step;
    EXPECT_LE(max_abs_diff(a.attention, b.attention), kProbTol)
        << "step " << step;
    EXPECT_LE(max_abs_diff(a.k_norm, b.k_norm), kv_norm_tol(a.k_norm));
    EXPECT_LE(max_abs_diff(a.v_norm, b.v_norm), kv_norm_tol(a.v_norm));
    EXPECT_EQ(a.flops, b.flops);
    EXPECT_EQ(a.kv_rows, b.kv_rows);
    EXPECT_EQ((*cache_gpu)->length(), (*cache_cpu)->length());
    // Next token: the CPU's greedy choice, so both continue on the same sequence.
    tokens.push_back(int32_t(std::max_element(a.logits.begin(), a.logits.end()) - a.logits.begin()));
  }
}

TEST_F(CudaBackendParity, ForwardMatchesCpuOnTinyModelsOfSeveralTypes) {
  // Q4_1 and Q8_0 run the native matvec; Q4_0 and F16 the fp32-copy path.
  for (GgmlType mt : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16}) {
    test::TinyModelSpec spec;
    spec.matrix_type = mt;
    spec.n_embd = 96;  // head_dim 24: not a multiple of the warp size
    spec.n_ff = 160;
    spec.seed = 3;
    auto model = load_tiny(spec, "types");
    ASSERT_TRUE(model);
    SCOPED_TRACE(ggml_type_name(mt));
    check_forward_parity(*model, KvDtype::F16, 6);
    check_forward_parity(*model, KvDtype::F16, 12);
  }
}

TEST_F(CudaBackendParity, ForwardMatchesCpuWithFp32Cache) {
  test::TinyModelSpec spec;
  auto model = load_tiny(spec, "f32cache");
  ASSERT_TRUE(model);
  check_forward_parity(*model, KvDtype::F32, 5);
  check_forward_parity(*model, KvDtype::F32, 11);
}

// A window of 5 on layer 0 (a ring of 5 slots, exercised past its wrap) and full layer 1:
// CUDA (with and without the decode graph) equals the CPU step by step, and both hold
// the same positions.
TEST_F(CudaBackendParity, WindowedRingMatchesCpu) {
  test::TinyModelSpec spec;
  spec.seed = 9;
  auto model = load_tiny(spec, "ring");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  KvCacheConfig cfg = kv_config_full({c.n_layer, c.n_head_kv, c.head_dim}, {});
  cfg.layers[0] = KvLayerRule{5, 0, 5};
  for (bool use_graph : {false, true}) {
    SCOPED_TRACE(use_graph ? "graph" : "no graph");
    CudaBackendOptions opt;
    opt.decode_graph = use_graph;
    auto cuda = make_cuda_backend(*model, opt);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    auto cpu = make_cpu_backend(1);
    auto cc = cpu->create_kv_cache(cfg, 4);
    auto gc = (*cuda)->create_kv_cache(cfg, 4);
    ASSERT_TRUE(cc.ok() && gc.ok());
    std::vector<int32_t> tokens = {1, 40, 41, 72, 100, 101, 102};
    for (int step = 0; step < 12; ++step) {
      const int pos0 = (*cc)->length();
      const int T = step == 0 ? int(tokens.size()) : 1;
      ForwardOutput a, b;
      ASSERT_TRUE(forward(*cpu, *model, tokens.data() + pos0, T, pos0, **cc, a).ok());
      Status st = forward(**cuda, *model, tokens.data() + pos0, T, pos0, **gc, b);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_LE(max_abs_diff(a.logits, b.logits), kLogitTol) << "step " << step;
      EXPECT_LE(max_abs_diff(a.attention, b.attention), kProbTol) << "step " << step;
      EXPECT_EQ(a.flops, b.flops);
      for (int l = 0; l < c.n_layer; ++l) EXPECT_EQ((*cc)->held_ranges(l), (*gc)->held_ranges(l));
      EXPECT_EQ((*gc)->bytes_used(), (*cc)->bytes_used());
      tokens.push_back(int32_t(std::max_element(a.logits.begin(), a.logits.end()) - a.logits.begin()));
    }
    EXPECT_EQ((*gc)->held(0), 5);
  }
}

TEST_F(CudaBackendParity, SessionSixteenStepsInBothModesMatchCpu) {
  test::TinyModelSpec spec;
  spec.seed = 7;
  std::shared_ptr<const Model> model = load_tiny(spec, "session");
  ASSERT_TRUE(model);
  for (CacheMode mode : {CacheMode::Cache, CacheMode::NoCache}) {
    SCOPED_TRACE(cache_mode_name(mode));
    auto cuda = make_cuda_backend(*model);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    RunResult a = run_session(model, make_cpu_backend(1), mode, 16);
    RunResult b = run_session(model, std::move(cuda.value()), mode, 16);
    ASSERT_EQ(a.steps.size(), 16u);
    ASSERT_EQ(b.steps.size(), 16u);
    size_t compared = 0;
    for (size_t i = 0; i < a.steps.size(); ++i, ++compared) {
      const StepTrace &x = a.steps[i], &y = b.steps[i];
      const float tol = kLogitTol;
      if (x.token_id != y.token_id) {
        // Only a near-tie may flip; after that the sequences differ, so stop comparing.
        EXPECT_LT(top2_margin(a.logits[i]), 2 * tol) << "step " << i << " chose " << y.token_id
                                                     << " instead of " << x.token_id;
        break;
      }
      EXPECT_LE(max_abs_diff(a.logits[i], b.logits[i]), tol) << "step " << i;
      EXPECT_EQ(x.flops, y.flops) << "step " << i;
      EXPECT_EQ(x.flops_total, y.flops_total) << "step " << i;
      EXPECT_EQ(x.kv_rows, y.kv_rows) << "step " << i;
      EXPECT_EQ(x.kv_bytes, y.kv_bytes) << "step " << i;
      EXPECT_EQ(x.n_attn, y.n_attn);
      EXPECT_LE(max_abs_diff(x.attention, y.attention), kProbTol)
          << "step " << i;
#if defined(KVSCOPE_REAL_GPU_TEST)
      EXPECT_GT(y.device_ms, 0.0) << "CUDA events time every step";
#else
      EXPECT_GE(y.device_ms, 0.0) << "the emulator's events time every step";
#endif
      EXPECT_NE(y.backend.find("cuda"), std::string::npos);
    }
    // A flip at a near-tie ends the comparison; it must not come early (these seeds
    // have none: all 16 steps are compared).
    EXPECT_EQ(compared, 16u);
  }
}

// Tiny random-weight files of each family — gemma3 (NeoX RoPE, Q/K norm, post norms, GELU
// gate, window 5 smaller than the sequence, MQA, attention width != C) and qwen2 (q/k/v
// biases, NeoX RoPE) — through the emulated CUDA backend: logits match the CPU step by
// step in both cache modes, and CACHE and NO CACHE give identical tokens on CUDA too.
TEST_F(CudaBackendParity, TinyFamiliesMatchCpuInBothCacheModes) {
  for (const char* arch : {"gemma3", "qwen2"}) {
    SCOPED_TRACE(arch);
    const std::string path = tiny_path(arch);
    ASSERT_TRUE(test::write_tiny_model(test::tiny_family(arch, 31), path).ok());
    auto m = Model::load(path);
    std::filesystem::remove(path);
    ASSERT_TRUE(m.ok()) << m.error().message;
    std::shared_ptr<const Model> model = std::move(m.value());
    std::vector<RunResult> gpu;
    for (CacheMode mode : {CacheMode::Cache, CacheMode::NoCache}) {
      SCOPED_TRACE(cache_mode_name(mode));
      auto cuda = make_cuda_backend(*model);
      ASSERT_TRUE(cuda.ok()) << cuda.error().message;
      RunResult a = run_session(model, make_cpu_backend(1), mode, 16);
#if !defined(KVSCOPE_REAL_GPU_TEST)
      const uint64_t graphs0 = kvscope::emu::graph_launches();
#endif
      RunResult b = run_session(model, std::move(cuda.value()), mode, 16);
#if !defined(KVSCOPE_REAL_GPU_TEST)
      // Every CACHE decode step (15 after the prompt) runs as one graph launch.
      EXPECT_EQ(kvscope::emu::graph_launches() - graphs0, mode == CacheMode::Cache ? 15u : 0u);
#endif
      ASSERT_EQ(a.steps.size(), 16u);
      ASSERT_EQ(b.steps.size(), 16u);
      float worst = 0;
      for (size_t i = 0; i < a.steps.size(); ++i) {
        ASSERT_EQ(a.steps[i].token_id, b.steps[i].token_id) << "step " << i;
        worst = std::max(worst, max_abs_diff(a.logits[i], b.logits[i]));
        EXPECT_LE(max_abs_diff(a.steps[i].attention, b.steps[i].attention), kProbTol);
        EXPECT_EQ(a.steps[i].flops, b.steps[i].flops);
        EXPECT_EQ(a.steps[i].kv_bytes, b.steps[i].kv_bytes);
      }
      EXPECT_LE(worst, kLogitTol);
      std::printf("%s %s: largest logit difference CUDA vs CPU %.2e\n", arch,
                  cache_mode_name(mode), worst);
      gpu.push_back(std::move(b));
    }
    for (size_t i = 0; i < 16; ++i)
      EXPECT_EQ(gpu[0].steps[i].token_id, gpu[1].steps[i].token_id) << "CUDA CACHE vs NO CACHE step " << i;
  }
}

// A prompt longer than one batch (the forward runs 512 tokens at a time) on the tiny gemma3
// model (windows of 5): the batches' cache writes, ring wrap-around and K/V norms match the
// CPU, and so do two decode steps after it.
TEST_F(CudaBackendParity, LongPromptInBatchesMatchesCpu) {
  test::TinyModelSpec spec = test::tiny_family("gemma3", 33);
  spec.n_ctx = 1024;
  const std::string path = tiny_path("long");
  ASSERT_TRUE(test::write_tiny_model(spec, path).ok());
  auto m = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Model& model = **m;
  auto cuda = make_cuda_backend(model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  auto cpu = make_cpu_backend(1);
  const KvCacheConfig cfg = kv_cache_config(model, KvTypes{}, KvPolicy::ModelWindow);
  auto cache_cpu = cpu->create_kv_cache(cfg, 64);
  auto cache_gpu = (*cuda)->create_kv_cache(cfg, 64);
  ASSERT_TRUE(cache_cpu.ok() && cache_gpu.ok());
  std::vector<int32_t> tokens(560);
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = int32_t((t * 29 + 5) % 200);
  for (int step = 0; step < 3; ++step) {
    const int pos0 = (*cache_cpu)->length();
    const int T = int(tokens.size()) - pos0;
    ForwardOutput a, b;
    ASSERT_TRUE(forward(*cpu, model, tokens.data() + pos0, T, pos0, **cache_cpu, a).ok());
    Status s = forward(**cuda, model, tokens.data() + pos0, T, pos0, **cache_gpu, b);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_LE(max_abs_diff(a.logits, b.logits), kLogitTol) << "step " << step;
    EXPECT_LE(max_abs_diff(a.attention, b.attention), kProbTol) << "step " << step;
    EXPECT_LE(max_abs_diff(a.k_norm, b.k_norm), kv_norm_tol(a.k_norm));
    EXPECT_EQ(a.flops, b.flops);
    for (int l = 0; l < model.config().n_layer; ++l)
      EXPECT_EQ((*cache_gpu)->held_ranges(l), (*cache_cpu)->held_ranges(l)) << "layer " << l;
    tokens.push_back(int32_t(std::max_element(a.logits.begin(), a.logits.end()) - a.logits.begin()));
  }
}

// Context shifts (kernels/kv_rerotate.cu after the cache's relayout) on a tiny llama
// (keeping 2 positions, f16 and f32 caches) and a tiny Gemma 3 (NeoX, windowed rings):
// CUDA matches the CPU step by step through several shifts, in both cache modes.
TEST_F(CudaBackendParity, ContextShiftsMatchCpu) {
  test::TinyModelSpec llama;
  llama.seed = 9;
  const std::string path = tiny_path("shift");
  ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 31), path).ok());
  auto g = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(g.ok()) << g.error().message;
  struct Case {
    std::shared_ptr<const Model> model;
    int n_keep;
    KvDtype dtype;
  };
  std::shared_ptr<const Model> tiny_llama = load_tiny(llama, "shift_llama");
  ASSERT_TRUE(tiny_llama);
  const Case cases[] = {{tiny_llama, 2, KvDtype::F16},
                        {tiny_llama, 2, KvDtype::F32},
                        {std::move(g.value()), 0, KvDtype::F16}};
  for (const Case& c : cases) {
    for (CacheMode mode : {CacheMode::Cache, CacheMode::NoCache}) {
      SCOPED_TRACE(c.model->config().arch + " " + kv_dtype_name(c.dtype) + " " +
                   cache_mode_name(mode));
      KvLimits lim;
      lim.n_ctx = 14;
      lim.on_full = ContextPolicy::Shift;
      lim.n_keep = c.n_keep;
      auto cuda = make_cuda_backend(*c.model);
      ASSERT_TRUE(cuda.ok()) << cuda.error().message;
      RunResult a = run_session(c.model, make_cpu_backend(1), mode, 24, c.dtype, lim);
      RunResult b = run_session(c.model, std::move(cuda.value()), mode, 24, c.dtype, lim);
      ASSERT_EQ(a.steps.size(), 24u);
      ASSERT_EQ(b.steps.size(), 24u);
      int shifts = 0;
      for (size_t i = 0; i < a.steps.size(); ++i) {
        ASSERT_EQ(a.steps[i].token_id, b.steps[i].token_id) << "step " << i;
        ASSERT_EQ(a.steps[i].shift_n, b.steps[i].shift_n) << "step " << i;
        shifts += a.steps[i].shift_n > 0;
        EXPECT_LE(max_abs_diff(a.logits[i], b.logits[i]), kLogitTol) << "step " << i;
        EXPECT_LE(max_abs_diff(a.steps[i].attention, b.steps[i].attention), kProbTol)
            << "step " << i;
        EXPECT_EQ(a.steps[i].kv_bytes, b.steps[i].kv_bytes) << "step " << i;
      }
      EXPECT_GE(shifts, 2);
    }
  }
}

TEST_F(CudaBackendParity, DefaultModelPromptAndTwoDecodeStepsSameTop5) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL))
    GTEST_SKIP() << "default model absent: run scripts/fetch_model.sh";
  auto m = Model::load(KVSCOPE_DEFAULT_MODEL);
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::shared_ptr<const Model> model = std::move(m.value());
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  // A short raw prompt keeps the emulated run to a few seconds (all matvec kernels).
  RunResult a = run_session(model, make_cpu_backend(0), CacheMode::Cache, 3);
  RunResult b = run_session(model, std::move(cuda.value()), CacheMode::Cache, 3);
  ASSERT_EQ(a.steps.size(), 3u);
  ASSERT_EQ(b.steps.size(), 3u);
  // Logits within 10·kLogitTol, as Gemma 3's below and for the same reason: 30 layers of
  // width 576 whose residual grows to hundreds, where fp32 summation order alone moves a
  // logit by up to ~1e-3 (each layer's dot products of n terms differ by up to ~n·2^-24
  // relative to the sum of |terms|, and the differences add up over the layers); the tiny
  // models' kLogitTol is for 2 layers. The largest difference is printed (5.1e-4 on the
  // emulator).
  float worst = 0;
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_GE(a.steps[i].top.size(), 5u);
    ASSERT_GE(b.steps[i].top.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(a.steps[i].top[k].id, b.steps[i].top[k].id) << "step " << i << " rank " << k;
      EXPECT_NEAR(a.steps[i].top[k].logit, b.steps[i].top[k].logit, 10 * kLogitTol);
      worst = std::max(worst, std::fabs(a.steps[i].top[k].logit - b.steps[i].top[k].logit));
    }
  }
  std::printf("default model: largest top-5 logit difference %.2e\n", worst);
}

// Gemma 3 270M, the second built-in model: a 12-token prompt (cuBLAS fp32 GEMMs) and two
// decode steps (decode graph) give the CPU's top-5 ids with logits within kLogitTol x 10
// (18 layers whose residual reaches ~1e5: fp32 summation order moves logits by ~1e-3,
// measured 1.1e-3) and attention rows within kProbTol x 10 (Q/K-normed scores are sharp:
// measured 3.5e-4).
TEST_F(CudaBackendParity, Gemma3PromptAndTwoDecodeStepsSameTop5) {
  const std::string path = std::string(KVSCOPE_SOURCE_DIR) + "/assets/models/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "Gemma 3 absent: run scripts/fetch_model.sh gemma3-270m";
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Model& model = **m;
  auto cuda = make_cuda_backend(model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  auto cpu = make_cpu_backend(0);
  const KvCacheConfig cfg = kv_cache_config(model, {}, KvPolicy::ModelWindow);
  auto cc = cpu->create_kv_cache(cfg, 16);
  auto gc = (*cuda)->create_kv_cache(cfg, 16);
  ASSERT_TRUE(cc.ok() && gc.ok());
  // "The capital of France is the capital of" with BOS.
  std::vector<int32_t> tokens = {2, 818, 5279, 529, 7001, 563, 506, 5279, 529, 506, 2891, 529};
  float worst = 0;
  for (int step = 0; step < 3; ++step) {
    const int pos0 = (*cc)->length();
    const int T = step == 0 ? int(tokens.size()) : 1;
    ForwardOutput a, b;
    ASSERT_TRUE(forward(*cpu, model, tokens.data() + pos0, T, pos0, **cc, a).ok());
    Status s = forward(**cuda, model, tokens.data() + pos0, T, pos0, **gc, b);
    ASSERT_TRUE(s.ok()) << s.message();
    std::vector<int32_t> order(a.logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int32_t x, int32_t y) { return a.logits[size_t(x)] > a.logits[size_t(y)]; });
    for (int k = 0; k < 5; ++k) {
      const size_t id = size_t(order[size_t(k)]);
      worst = std::max(worst, std::fabs(a.logits[id] - b.logits[id]));
      EXPECT_NEAR(b.logits[id], a.logits[id], 10 * kLogitTol) << "step " << step << " rank " << k;
    }
    const int32_t top_gpu = int32_t(std::max_element(b.logits.begin(), b.logits.end()) - b.logits.begin());
    EXPECT_EQ(top_gpu, order[0]) << "step " << step;
    EXPECT_LE(max_abs_diff(a.attention, b.attention), 10 * kProbTol) << "step " << step;
    EXPECT_EQ(a.flops, b.flops);
    tokens.push_back(order[0]);
  }
  std::printf("Gemma 3: largest top-5 logit difference CUDA vs CPU %.2e\n", worst);
}

TEST_F(CudaBackendParity, BadInputIsAnErrorNotACrash) {
  test::TinyModelSpec spec;
  auto model = load_tiny(spec, "errors");
  ASSERT_TRUE(model);
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  Backend& be = **cuda;
  auto x = be.scratch(0, 2, model->config().n_embd);
  ASSERT_TRUE(x.ok());
  const int32_t ids[2] = {0, model->config().n_vocab};  // second id is out of range
  Status s = be.embed(model->tok_embd(), ids, 1.0f, *x);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "embed: ids[1] is " + std::to_string(model->config().n_vocab) +
                           ", expected [0, " + std::to_string(model->config().n_vocab) + ")");
  // Wrong shapes are rejected before any kernel runs.
  auto y = be.scratch(1, 2, 7);
  ASSERT_TRUE(y.ok());
  s = be.matmul(model->layers()[0].wq, *y, *x);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "matmul: x.cols is 7, expected w.n_in = " +
                           std::to_string(model->config().n_embd));
  // The backend is still usable afterwards.
  const int32_t good[2] = {3, 4};
  EXPECT_TRUE(be.embed(model->tok_embd(), good, 1.0f, *x).ok());
  std::vector<float> host(size_t(x->size()));
  EXPECT_TRUE(be.download(*x, host.data()).ok());
  EXPECT_FALSE(std::isnan(host[0]));
}

// One side of the batched-decode comparison: a backend, its pool and one paged cache per
// sequence; `together` runs every decode step's rows in one forward_batch, else each
// sequence through forward_batch alone.
struct DecodeSide {
  const char* label = "";
  Backend* be = nullptr;
  bool together = true;
  std::shared_ptr<KvPool> pool;
  std::vector<std::unique_ptr<KvCache>> caches;
};

// Batched decode of sequences of different lengths on paged caches (prompts of 3, 8, 9,
// 15 and 17 tokens, 8-position blocks: the rows cross block boundaries at different
// steps): prompts alone, then 8 greedy steps (tokens fed from the CPU's logits) with every
// sequence's decode row in one forward_batch, which sends consecutive decode rows through the rows
// ops (one launch per layer on CUDA). On the CUDA backend each sequence's logits equal the same
// sequence decoded alone and the CPU's batch, and the greedy tokens are the same. At step 3,
// sequence 2 asks for its attention rows: the run splits around it (rows 0-1 and 3-4
// batched, 2 alone). Tokens are the CPU batch's greedy choice, fed to every side.
void check_batched_decode(const Model& model, const char* what) {
  SCOPED_TRACE(what);
  const KvCacheConfig cfg = kv_cache_config(model, {}, KvPolicy::Full);
  const KvLayerGroups groups = kv_layer_groups(cfg);
  const bool windowed = groups.count() > 1;
  const KvPoolConfig pc{
      {groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim}, cfg.types, 8, groups.count() * 5 * 4};
  auto cuda_batch = make_cuda_backend(model);
  ASSERT_TRUE(cuda_batch.ok()) << cuda_batch.error().message;
  auto cuda_alone = make_cuda_backend(model);
  ASSERT_TRUE(cuda_alone.ok()) << cuda_alone.error().message;
  auto cpu = make_cpu_backend(1);
  DecodeSide sides[3] = {{"cpu batch", cpu.get(), true, {}, {}},
                         {"cuda batch", cuda_batch->get(), true, {}, {}},
                         {"cuda alone", cuda_alone->get(), false, {}, {}}};
  std::vector<std::vector<int32_t>> toks;
  const int32_t base[] = {1, 40, 41, 72, 100, 101, 102, 33, 3, 90, 91, 92, 7, 8, 9, 10, 11};
  for (int len : {3, 8, 9, 15, 17}) {
    toks.emplace_back(base, base + len);
    toks.back()[0] = int32_t(1 + toks.size());  // every prompt differs from its first token
  }
  const size_t B = toks.size();
  const auto argmax = [](const std::vector<float>& l) {
    return int32_t(std::max_element(l.begin(), l.end()) - l.begin());
  };
  std::vector<int32_t> first(B);  // the CPU's greedy token after each prompt
  for (DecodeSide& side : sides) {
    auto p = side.be->create_kv_pool(pc);
    ASSERT_TRUE(p.ok()) << p.error().message;
    side.pool = *p;
    for (size_t i = 0; i < B; ++i) {
      auto k = side.be->create_paged_kv_cache(cfg, side.pool);
      ASSERT_TRUE(k.ok()) << k.error().message;
      side.caches.push_back(std::move(*k));
      std::vector<BatchSeqOutput> out;
      Status st = forward_batch(
          *side.be, model,
          {BatchSeq{side.caches.back().get(), toks[i].data(), int(toks[i].size())}}, out);
      ASSERT_TRUE(st.ok()) << side.label << ": " << st.message();
      if (side.be == cpu.get()) first[i] = argmax(out[0].logits);
    }
  }
  for (size_t i = 0; i < B; ++i) toks[i].push_back(first[i]);
  for (int step = 0; step < 8; ++step) {
    std::vector<BatchSeqOutput> out[3];
    for (int s = 0; s < 3; ++s) {
      DecodeSide& side = sides[s];
      std::vector<BatchSeq> batch;
      for (size_t i = 0; i < B; ++i) {
        KvCache* c = side.caches[i].get();
        BatchSeq seq{c, toks[i].data() + c->length(), 1};
        seq.attention = step == 3 && i == 2;
        batch.push_back(seq);
      }
      if (side.together) {
        Status st = forward_batch(*side.be, model, batch, out[s]);
        ASSERT_TRUE(st.ok()) << side.label << " step " << step << ": " << st.message();
      } else {
        for (const BatchSeq& seq : batch) {
          std::vector<BatchSeqOutput> one;
          Status st = forward_batch(*side.be, model, {seq}, one);
          ASSERT_TRUE(st.ok()) << side.label << " step " << step << ": " << st.message();
          out[s].push_back(std::move(one[0]));
        }
      }
      if (windowed) {
        for (auto& c : side.caches) ASSERT_TRUE(c->drop_outside_windows().ok());
      }
      std::vector<const std::vector<int32_t>*> tables;
      for (auto& c : side.caches)
        for (int g = 0; g < c->n_groups(); ++g) tables.push_back(&c->blocks(g));
      Status st = side.pool->check(tables);
      ASSERT_TRUE(st.ok()) << side.label << ": " << st.message();
    }
    for (size_t i = 0; i < B; ++i) {
      const auto& ref = out[0][i].logits;
      EXPECT_LE(max_abs_diff(ref, out[1][i].logits), kLogitTol)
          << "step " << step << " sequence " << i << ": cuda batch vs cpu batch";
      EXPECT_LE(max_abs_diff(out[2][i].logits, out[1][i].logits), kLogitTol)
          << "step " << step << " sequence " << i << ": cuda batch vs cuda alone";
      EXPECT_LE(max_abs_diff(out[0][i].attention, out[1][i].attention), kProbTol)
          << "step " << step << " sequence " << i;
      const int32_t next = argmax(ref);
      if (top2_margin(ref) > 2 * kLogitTol) {
        EXPECT_EQ(argmax(out[1][i].logits), next) << "step " << step << " sequence " << i;
        EXPECT_EQ(argmax(out[2][i].logits), next) << "step " << step << " sequence " << i;
      }
      toks[i].push_back(next);
    }
  }
  for (size_t i = 0; i < B; ++i) EXPECT_EQ(sides[1].caches[i]->length(), int(toks[i].size()) - 1);
}

TEST_F(CudaBackendParity, BatchedDecodeOnPagedCachesEqualsEachAloneAndCpu) {
  test::TinyModelSpec spec;
  spec.seed = 9;
  std::shared_ptr<const Model> llama = load_tiny(spec, "rows");
  ASSERT_TRUE(llama);
  check_batched_decode(*llama, "llama");
  const std::string path = tiny_path("rowswin");
  ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 21), path).ok());
  auto gemma = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(gemma.ok()) << gemma.error().message;
  check_batched_decode(**gemma, "gemma3 (windowed groups)");
}

// Whether the backend's name (its device line) says `what`.
bool name_says(const Backend& be, const char* what) {
  return be.name().find(what) != std::string::npos;
}

#if !defined(KVSCOPE_REAL_GPU_TEST)
// The emulated device's compute capability for the guard's lifetime (KVSCOPE_EMU_CC sets
// it for a whole run).
class EmulatedComputeCapability {
 public:
  explicit EmulatedComputeCapability(int cc) : prev_(kvscope::emu::compute_capability()) {
    kvscope::emu::set_compute_capability(cc);
  }
  ~EmulatedComputeCapability() { kvscope::emu::set_compute_capability(prev_); }

 private:
  int prev_;
};

// Launch counting and the decode graph, on the emulator (which counts launches).
// Kernel launches of one decode step (T = 1) issued directly (no graph) or through the
// decode graph: per layer norm_qkv_kv_write (residual add + RMSNorm, q/k/v products, RoPE,
// K/V store, row norms), attention (split over key chunks, merged by the last block in the
// same launch), Wo, norm_ffn (residual add + RMSNorm, gate/up + activation, down split
// over F and summed by the last block); plus embed, the final add + output_norm and the LM
// head: 4 L + 3 (it was 10 L + 3). The default tiny llama has the default model's shape
// features (SmolLM2: llama, Q4_1 matrices, no biases or q/k norms); tiny Gemma 3 (q/k
// norms, post norms) adds only the last layer's post_ffw_norm: 4 L + 4. On an emulated
// sm_90 device every one of those kernels carries the programmatic-launch attribute,
// eagerly and replayed from the graph (below sm_90 none does), and every thread of every
// kernel waited for the previous kernel first (the emulator fails a programmatic launch
// where one did not).
TEST_F(CudaBackendParity, DecodeStepLaunchesFourPerLayerOrOneGraph) {
  test::TinyModelSpec spec;
  auto llama = load_tiny(spec, "launches");
  ASSERT_TRUE(llama);
  const std::string path = tiny_path("launches_gemma3");
  ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 3), path).ok());
  auto gemma = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(gemma.ok()) << gemma.error().message;
  for (int cc : {80, 90})
  for (const Model* model : {llama.get(), gemma->get()}) {
    EmulatedComputeCapability device(cc);
    const ModelConfig& c = model->config();
    const uint64_t constant = c.post_ffn_norm ? 4 : 3;
    for (bool use_graph : {false, true}) {
      SCOPED_TRACE(std::string(model->config().arch) + (use_graph ? " graph" : " no graph") +
                   " sm_" + std::to_string(cc));
      CudaBackendOptions opt;
      opt.decode_graph = use_graph;
      auto cuda = make_cuda_backend(*model, opt);
      ASSERT_TRUE(cuda.ok()) << cuda.error().message;
      if (cc == 90) {
        EXPECT_TRUE(name_says(**cuda, ", PDL on)")) << (*cuda)->name();
      }
      auto cache = (*cuda)->create_kv_cache(kv_cache_config(*model, {}, KvPolicy::Full), 32);
      ASSERT_TRUE(cache.ok());
      const int32_t tokens[8] = {1, 40, 41, 72, 100, 101, 102, 33};
      ForwardOutput out;
      ASSERT_TRUE(forward(**cuda, *model, tokens, 5, 0, **cache, out).ok());
      for (int pos = 5; pos < 8; ++pos) {
        const uint64_t direct0 = kvscope::emu::direct_kernel_launches();
        const uint64_t graphs0 = kvscope::emu::graph_launches();
        const uint64_t kernels0 = kvscope::emu::kernels_run();
        const uint64_t pdl0 = kvscope::emu::programmatic_kernels_run();
        const uint64_t waited0 = kvscope::emu::kernels_all_waited();
        Status st = forward(**cuda, *model, tokens + pos, 1, pos, **cache, out);
        ASSERT_TRUE(st.ok()) << st.message();
        const uint64_t direct = kvscope::emu::direct_kernel_launches() - direct0;
        const uint64_t graphs = kvscope::emu::graph_launches() - graphs0;
        const uint64_t kernels = kvscope::emu::kernels_run() - kernels0;
        const uint64_t pdl = kvscope::emu::programmatic_kernels_run() - pdl0;
        EXPECT_EQ(pdl, cc == 90 ? kernels : 0u) << "pos " << pos;
        EXPECT_EQ(kvscope::emu::kernels_all_waited() - waited0, kernels) << "pos " << pos;
        // The budget, and the exact figure.
        EXPECT_LE(kernels, uint64_t(4 * c.n_layer) + constant) << "pos " << pos;
        EXPECT_EQ(kernels, uint64_t(4 * c.n_layer) + constant) << "pos " << pos;
        if (use_graph) {
          // Captured on the first decode step, replayed after: never a direct launch.
          EXPECT_EQ(direct, 0u) << "pos " << pos;
          EXPECT_EQ(graphs, 1u) << "pos " << pos;
        } else {
          EXPECT_EQ(direct, kernels) << "pos " << pos;
          EXPECT_EQ(graphs, 0u);
        }
      }
    }
  }
}

// The fused decode step's last-block epilogues (norm_qkv_kv_write, the attention merge,
// norm_ffn) do not depend on which block finishes last: with blocks spread over four
// emulator workers (finishing in varying orders) a session's logits, attention rows and K/V
// norms are bit-identical to one worker's, for the tiny llama and the tiny Gemma 3.
TEST_F(CudaBackendParity, FusedDecodeStepsBitIdenticalWhateverBlockFinishesLast) {
  const std::string path = tiny_path("workers_gemma3");
  ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 5), path).ok());
  auto g = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(g.ok()) << g.error().message;
  test::TinyModelSpec spec;
  spec.seed = 17;
  const std::shared_ptr<const Model> models[2] = {load_tiny(spec, "workers"),
                                                  std::move(g.value())};
  for (const std::shared_ptr<const Model>& model : models) {
    ASSERT_TRUE(model);
    SCOPED_TRACE(model->config().arch);
    std::vector<RunResult> runs;
    const int before = kvscope::emu::workers();
    for (int workers : {1, 4}) {
      kvscope::emu::set_workers(workers);
      auto cuda = make_cuda_backend(*model);
      ASSERT_TRUE(cuda.ok()) << cuda.error().message;
      runs.push_back(run_session(model, std::move(cuda.value()), CacheMode::Cache, 10));
    }
    kvscope::emu::set_workers(before);
    ASSERT_EQ(runs[0].steps.size(), 10u);
    ASSERT_EQ(runs[1].steps.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(runs[0].logits[i], runs[1].logits[i]) << "step " << i;
      EXPECT_EQ(runs[0].steps[i].attention, runs[1].steps[i].attention) << "step " << i;
      EXPECT_EQ(runs[0].steps[i].k_norm, runs[1].steps[i].k_norm) << "step " << i;
      EXPECT_EQ(runs[0].steps[i].v_norm, runs[1].steps[i].v_norm) << "step " << i;
    }
  }
}

// What one decode step of a session (the app's path: paged cache, attention rows and K/V
// norms for the scene) costs in kernels and host<->device bytes, counted by the emulator.
// Issue-level targets are <= 4 kernels per layer plus a constant (met: 4 L + 3) and <= 4 KiB
// to the host plus the candidates; this test holds today's figures so that neither grows
// unnoticed.
TEST_F(CudaBackendParity, DecodeStepKernelsAndTransfers) {
  test::TinyModelSpec spec;
  std::shared_ptr<const Model> model = load_tiny(spec, "budget");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  SessionConfig cfg;
  cfg.max_tokens = 16;
  cfg.stop_at_eos = false;
  cfg.device_sampling = false;  // the whole logits row to the host (DecodeStepSamplesOnTheDevice)
  auto s = Session::create(model, std::move(cuda.value()), cfg);
  ASSERT_TRUE(s.ok()) << s.error().message;
  PromptSpec p;
  p.text = "hi there";
  ASSERT_TRUE((*s)->reset(p).ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*s)->step().ok());  // the prompt; the graph's capture
  for (int i = 0; i < 4; ++i) {
    const uint64_t k0 = kvscope::emu::kernels_run(), h0 = kvscope::emu::bytes_to_host(),
                   d0 = kvscope::emu::bytes_to_device();
    auto t = (*s)->step();
    ASSERT_TRUE(t.ok()) << t.error().message;
    const uint64_t kernels = kvscope::emu::kernels_run() - k0,
                   to_host = kvscope::emu::bytes_to_host() - h0,
                   to_dev = kvscope::emu::bytes_to_device() - d0;
    const int keys = t->pos;  // the step's input token sits at t->pos - 1
    std::printf("decode step at %d: %llu kernels, %llu B to the host, %llu B to the device\n",
                t->pos, (unsigned long long)kernels, (unsigned long long)to_host,
                (unsigned long long)to_dev);
    // 4 per layer + embed, final norm, LM head (DecodeStepLaunchesFourPerLayerOrOneGraph).
    EXPECT_EQ(kernels, uint64_t(4 * c.n_layer + 3));
    // The logits, the attention rows the scene draws ([L][H][keys]) and each layer's K and
    // V row norms, in fp32.
    EXPECT_EQ(to_host, uint64_t(4) * (uint64_t(c.n_vocab) + uint64_t(c.n_layer) * c.n_head * keys +
                                      2 * uint64_t(c.n_layer)));
    // The input token's id and its position: block tables and slot maps change only at a
    // block boundary (every 16 positions), not here.
    EXPECT_LE(to_dev, 64u);
  }
}

// The same decode steps sampled on the device (the default): the three sampler kernels run
// after the step's others, and what reaches the host is the candidates (a 32-byte header
// and 8 bytes per candidate: top_candidates + 1 of them for greedy) and the K/V row norms —
// plus the attention rows only when the session is asked for them, then copied without
// waiting. Side by side with a session that takes the whole row, in lockstep, so that
// the kernel difference does not depend on how many the forward itself launches.
TEST_F(CudaBackendParity, DecodeStepSamplesOnTheDevice) {
  test::TinyModelSpec spec;
  std::shared_ptr<const Model> model = load_tiny(spec, "budget");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const auto make = [&](bool device, bool attention) {
    auto cuda = make_cuda_backend(*model);
    EXPECT_TRUE(cuda.ok()) << cuda.error().message;
    SessionConfig cfg;
    cfg.max_tokens = 16;
    cfg.stop_at_eos = false;
    cfg.device_sampling = device;
    cfg.attention_rows = attention;
    auto s = Session::create(model, std::move(cuda.value()), cfg);
    EXPECT_TRUE(s.ok()) << s.error().message;
    PromptSpec p;
    p.text = "hi there";
    EXPECT_TRUE((*s)->reset(p).ok());
    return std::move(s.value());
  };
  std::unique_ptr<Session> full = make(false, true), dev = make(true, false),
                           dev_attn = make(true, true);
  for (Session* s : {full.get(), dev.get(), dev_attn.get()})
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(s->step().ok());  // the prompt; the graph's capture
  const uint64_t n_cand = uint64_t(SessionConfig{}.top_candidates) + 1;
  const uint64_t norms = 4 * 2 * uint64_t(c.n_layer), candidates = 32 + 8 * n_cand;
  // Whether a step's candidates settle it on the device depends on the logits' values and
  // on the order the emulated blocks sum in; the two steps above may have fallen back to
  // the whole row (a correct path), the four measured below must not have.
  const uint64_t fallbacks_before = dev->device_sampling_stats().fallbacks;
  for (int i = 0; i < 4; ++i) {
    struct Cost {
      uint64_t kernels, to_host;
      StepTrace t;
    };
    const auto step = [](Session& s) {
      const uint64_t k0 = kvscope::emu::kernels_run(), h0 = kvscope::emu::bytes_to_host();
      auto t = s.step();
      EXPECT_TRUE(t.ok()) << t.error().message;
      return Cost{kvscope::emu::kernels_run() - k0, kvscope::emu::bytes_to_host() - h0,
                  t.ok() ? std::move(t.value()) : StepTrace{}};
    };
    const Cost a = step(*full), b = step(*dev), d = step(*dev_attn);
    const uint64_t keys = uint64_t(b.t.pos), attn = 4 * uint64_t(c.n_layer) * c.n_head * keys;
    std::printf("decode step at %d: %llu B to the host with the whole row, %llu B sampled on "
                "the device (%llu B with the attention rows)\n",
                b.t.pos, (unsigned long long)a.to_host, (unsigned long long)b.to_host,
                (unsigned long long)d.to_host);
    EXPECT_EQ(b.kernels, a.kernels + 3);
    EXPECT_EQ(d.kernels, a.kernels + 3);
    EXPECT_EQ(b.to_host, candidates + norms);
    EXPECT_LE(b.to_host, 4096 + 8 * n_cand);
    EXPECT_EQ(d.to_host, candidates + norms + attn);
    EXPECT_EQ(a.to_host, 4 * uint64_t(c.n_vocab) + norms + attn);
    // The same token, candidates and attention rows as the whole-row path.
    EXPECT_EQ(b.t.token_id, a.t.token_id);
    ASSERT_EQ(b.t.top.size(), a.t.top.size());
    for (size_t j = 0; j < a.t.top.size(); ++j) {
      EXPECT_EQ(b.t.top[j].id, a.t.top[j].id);
      EXPECT_EQ(b.t.top[j].p, a.t.top[j].p);
      EXPECT_EQ(b.t.top[j].logit, a.t.top[j].logit);
      EXPECT_EQ(b.t.top[j].raw_logit, a.t.top[j].raw_logit);
    }
    EXPECT_EQ(b.t.sampled_rank, a.t.sampled_rank);
    EXPECT_TRUE(b.t.attention.empty());
    EXPECT_EQ(b.t.n_attn, 0);
    EXPECT_EQ(d.t.attention, a.t.attention);
    EXPECT_EQ(d.t.n_attn, a.t.n_attn);
  }
  EXPECT_EQ(dev->device_sampling_stats().steps, 6u);
  EXPECT_EQ(dev->device_sampling_stats().fallbacks, fallbacks_before);
  // The row is still there for whoever asks: the same logits as the whole-row session's.
  EXPECT_EQ(dev->last_logits(), full->last_logits());
}

// Sampled and greedy runs of 64 steps on the CUDA backend, sampled on the device, in both
// cache modes: the same tokens as the CPU backend, and (CACHE, every setting) the same
// tokens and candidates, probabilities bit for bit, as the CUDA backend taking the whole
// row every step. NO CACHE (quadratic under the emulator) runs greedy and top-k. Under
// AddressSanitizer both modes run 24 steps (the same code; the release stage runs all 64).
TEST_F(CudaBackendParity, DeviceSamplingSixtyFourStepsEqualCpuInBothModes) {
  test::TinyModelSpec spec;
  spec.seed = 5;
  std::shared_ptr<const Model> model = load_tiny(spec, "devsample");
  ASSERT_TRUE(model);
  std::vector<SamplerConfig> configs(4);
  configs[1].temperature = 0.9f;
  configs[1].top_k = 20;
  configs[1].seed = 7;
  configs[2].temperature = 0.8f;
  configs[2].top_p = 0.9f;
  configs[2].top_k = 40;  // top-p alone on this flat tiny model needs the whole row
  configs[2].seed = 3;
  configs[3].temperature = 1.3f;
  configs[3].min_p = 0.1f;
  configs[3].top_k = 30;
  configs[3].seed = 11;
  for (CacheMode mode : {CacheMode::Cache, CacheMode::NoCache})
    for (size_t ci = 0; ci < (mode == CacheMode::Cache ? configs.size() : 2); ++ci) {
      SCOPED_TRACE(std::string(cache_mode_name(mode)) + " config " + std::to_string(ci));
      const int steps = test::kAddressSanitizer ? 24 : 64;
      const auto run = [&](std::unique_ptr<Backend> be, bool device, Session::DeviceSamplingStats* st) {
        SessionConfig cfg;
        cfg.mode = mode;
        cfg.max_tokens = steps;
        cfg.stop_at_eos = false;
        cfg.device_sampling = device;
        cfg.attention_rows = false;
        auto s = Session::create(model, std::move(be), cfg);
        EXPECT_TRUE(s.ok()) << s.error().message;
        std::vector<StepTrace> out;
        if (!s.ok()) return out;
        (*s)->set_sampler(configs[ci]);
        EXPECT_TRUE((*s)->reset_tokens({1, 40, 41, 72, 100}).ok());
        for (int i = 0; i < steps && !(*s)->done(); ++i) {
          auto t = (*s)->step();
          EXPECT_TRUE(t.ok()) << t.error().message;
          if (!t.ok()) break;
          out.push_back(std::move(t.value()));
        }
        if (st) *st = (*s)->device_sampling_stats();
        return out;
      };
      auto cuda_a = make_cuda_backend(*model);
      ASSERT_TRUE(cuda_a.ok());
      Session::DeviceSamplingStats st;
      const auto dev = run(std::move(cuda_a.value()), true, &st);
      const auto cpu = run(make_cpu_backend(1), true, nullptr);
      ASSERT_EQ(dev.size(), size_t(steps));
      ASSERT_EQ(cpu.size(), dev.size());
      // Every step through the device sampler; the few it cannot settle (an inv on a
      // rounding boundary: a flat 264-token distribution is the hard case) took the row.
      EXPECT_EQ(st.steps, uint64_t(steps));
      EXPECT_LE(st.fallbacks, 8u);
      for (size_t i = 0; i < dev.size(); ++i)
        ASSERT_EQ(dev[i].token_id, cpu[i].token_id) << "step " << i;
      if (mode == CacheMode::NoCache) continue;
      auto cuda_b = make_cuda_backend(*model);
      ASSERT_TRUE(cuda_b.ok());
      const auto full = run(std::move(cuda_b.value()), false, nullptr);
      ASSERT_EQ(full.size(), dev.size());
      for (size_t i = 0; i < dev.size(); ++i) {
        ASSERT_EQ(dev[i].token_id, full[i].token_id) << "step " << i;
        ASSERT_EQ(dev[i].top.size(), full[i].top.size());
        for (size_t j = 0; j < dev[i].top.size(); ++j) {
          EXPECT_EQ(dev[i].top[j].id, full[i].top[j].id) << "step " << i << " rank " << j;
          EXPECT_EQ(dev[i].top[j].p, full[i].top[j].p) << "step " << i << " rank " << j;
        }
        EXPECT_EQ(dev[i].sampled_rank, full[i].sampled_rank);
      }
    }
}

// Logit shaping stays on the host: with a penalty no step samples on the device, and
// while a minimum length holds tokens back neither do those steps; the tokens are the
// CPU backend's either way.
TEST_F(CudaBackendParity, ShapedStepsTakeTheWholeRow) {
  test::TinyModelSpec spec;
  std::shared_ptr<const Model> model = load_tiny(spec, "shaped");
  ASSERT_TRUE(model);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "repeat penalty" : "min_tokens 3");
    SamplerConfig sc;
    sc.temperature = 0.9f;
    sc.top_k = 12;
    sc.seed = 4;
    if (which == 0) sc.penalties.repeat = 1.3f;
    const auto run = [&](std::unique_ptr<Backend> be, Session::DeviceSamplingStats* st) {
      SessionConfig cfg;
      cfg.max_tokens = 16;
      cfg.stop_at_eos = false;
      cfg.min_tokens = which == 1 ? 3 : 0;
      auto s = Session::create(model, std::move(be), cfg);
      EXPECT_TRUE(s.ok()) << s.error().message;
      std::vector<int32_t> ids;
      if (!s.ok()) return ids;
      (*s)->set_sampler(sc);
      EXPECT_TRUE((*s)->reset_tokens({1, 40, 41, 72}).ok());
      while (!(*s)->done()) {
        auto t = (*s)->step();
        EXPECT_TRUE(t.ok()) << t.error().message;
        if (!t.ok()) break;
        ids.push_back(t->token_id);
      }
      if (st) *st = (*s)->device_sampling_stats();
      return ids;
    };
    auto cuda = make_cuda_backend(*model);
    ASSERT_TRUE(cuda.ok());
    Session::DeviceSamplingStats st;
    const std::vector<int32_t> dev = run(std::move(cuda.value()), &st);
    EXPECT_EQ(dev.size(), 16u);
    EXPECT_EQ(dev, run(make_cpu_backend(1), nullptr));
    EXPECT_EQ(st.steps, which == 0 ? 0u : 13u);
  }
}

TEST_F(CudaBackendParity, DecodeGraphSixteenStepsEqualEagerAndCpu) {
  test::TinyModelSpec spec;
  spec.seed = 11;
  spec.n_embd = 96;  // head_dim 24
  std::shared_ptr<const Model> model = load_tiny(spec, "graph");
  ASSERT_TRUE(model);
  for (KvDtype dtype : {KvDtype::F16, KvDtype::F32}) {
    SCOPED_TRACE(kv_dtype_name(dtype));
    std::vector<RunResult> runs;
    for (bool use_graph : {false, true}) {
      CudaBackendOptions opt;
      opt.decode_graph = use_graph;
      auto cuda = make_cuda_backend(*model, opt);
      ASSERT_TRUE(cuda.ok()) << cuda.error().message;
      const uint64_t graphs0 = kvscope::emu::graph_launches();
      runs.push_back(run_session(model, std::move(cuda.value()), CacheMode::Cache, 16, dtype));
      const uint64_t graphs = kvscope::emu::graph_launches() - graphs0;
      // Step 0 is the prompt; the 15 decode steps each run as one graph launch.
      EXPECT_EQ(graphs, use_graph ? 15u : 0u);
    }
    RunResult cpu = run_session(model, make_cpu_backend(1), CacheMode::Cache, 16, dtype);
    ASSERT_EQ(runs[0].steps.size(), 16u);
    ASSERT_EQ(runs[1].steps.size(), 16u);
    ASSERT_EQ(cpu.steps.size(), 16u);
    for (size_t i = 0; i < 16; ++i) {
      // The graph replays the very same kernels with the same inputs: bit-identical.
      EXPECT_EQ(runs[0].logits[i], runs[1].logits[i]) << "step " << i;
      EXPECT_EQ(runs[0].steps[i].attention, runs[1].steps[i].attention) << "step " << i;
      EXPECT_EQ(runs[0].steps[i].token_id, runs[1].steps[i].token_id) << "step " << i;
      // And both equal the CPU backend (short path tolerances: prompt of 8 tokens).
      if (cpu.steps[i].token_id != runs[1].steps[i].token_id) {
        EXPECT_LT(top2_margin(cpu.logits[i]), 2 * kLogitTol) << "step " << i;
        break;
      }
      EXPECT_LE(max_abs_diff(cpu.logits[i], runs[1].logits[i]), kLogitTol) << "step " << i;
      EXPECT_LE(max_abs_diff(cpu.steps[i].attention, runs[1].steps[i].attention), kProbTol)
          << "step " << i;
    }
  }
}

// A batched decode step on paged caches issues a fixed number of launches, whatever the
// number of sequences: embed + 9 per layer (rmsnorm, or add + rmsnorm of the previous
// product, q/k/v product, the rows' RoPE + K/V store, their attention split + merge, Wo,
// add + rmsnorm, gate/up + activation, down) + the final add + rmsnorm + one LM head for
// every row. (Per sequence, RoPE + store and the two attention launches made it 6 + 3 B
// per layer.) Counted eagerly: with the decode graph on, such a step is one graph launch
// (test_cuda_backend_batched.cpp).
TEST_F(CudaBackendParity, BatchedDecodeStepLaunchesDoNotGrowWithTheBatch) {
  test::TinyModelSpec spec;
  auto model = load_tiny(spec, "rowslaunch");
  ASSERT_TRUE(model);
  const KvCacheConfig cfg = kv_cache_config(*model, {}, KvPolicy::Full);
  CudaBackendOptions opt;
  opt.decode_graph = false;
  auto cuda = make_cuda_backend(*model, opt);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  const int L = model->config().n_layer;
  const std::vector<int32_t> toks = {1, 40, 41, 72, 100, 101, 102, 33, 3, 90, 91, 92};
  for (int B : {2, 5, 8}) {
    auto pool = (*cuda)->create_kv_pool({cfg.shape, cfg.types, 8, 8 * B});
    ASSERT_TRUE(pool.ok()) << pool.error().message;
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<BatchSeq> batch;
    for (int i = 0; i < B; ++i) {
      auto k = (*cuda)->create_paged_kv_cache(cfg, *pool);
      ASSERT_TRUE(k.ok()) << k.error().message;
      caches.push_back(std::move(*k));
      std::vector<BatchSeqOutput> out;
      ASSERT_TRUE(
          forward_batch(**cuda, *model, {BatchSeq{caches.back().get(), toks.data(), 2 + i}}, out)
              .ok());
      batch.push_back(BatchSeq{caches.back().get(), toks.data() + 2 + i, 1});
    }
    std::vector<BatchSeqOutput> out;
    const uint64_t direct0 = kvscope::emu::direct_kernel_launches();
    Status st = forward_batch(**cuda, *model, batch, out);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(kvscope::emu::direct_kernel_launches() - direct0, uint64_t(9 * L + 3)) << "B " << B;
  }
}

// Paged caches on a block pool, several sequences in one forward_batch: sequence 1
// shares sequence 0's first full block, sequence 2 its first 10 positions (a partly
// filled block, copied by whichever of the two writes into it first). Every sequence's logits and attention rows
// equal the CPU's pool step by step, with the decode graph on and off; then sequence 0
// alone for a few single-token steps (the graph's path); the pools' invariants hold.
TEST_F(CudaBackendParity, PagedBatchMatchesCpu) {
  test::TinyModelSpec spec;
  spec.seed = 5;
  std::shared_ptr<const Model> model = load_tiny(spec, "paged");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const KvCacheConfig cfg = kv_config_full({c.n_layer, c.n_head_kv, c.head_dim}, {});
  const KvPoolConfig pc{cfg.shape, cfg.types, 8, 16};
  for (bool use_graph : {false, true}) {
    SCOPED_TRACE(use_graph ? "graph" : "no graph");
    CudaBackendOptions opt;
    opt.decode_graph = use_graph;
    auto cuda = make_cuda_backend(*model, opt);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    auto cpu = make_cpu_backend(1);
    Backend* be[2] = {cpu.get(), cuda->get()};
    std::shared_ptr<KvPool> pool[2];
    std::vector<std::unique_ptr<KvCache>> caches[2];
    for (int b = 0; b < 2; ++b) {
      auto p = be[b]->create_kv_pool(pc);
      ASSERT_TRUE(p.ok()) << p.error().message;
      pool[b] = *p;
      for (int i = 0; i < 3; ++i) {
        auto k = be[b]->create_paged_kv_cache(cfg, pool[b]);
        ASSERT_TRUE(k.ok()) << k.error().message;
        caches[b].push_back(std::move(*k));
      }
    }
    std::vector<std::vector<int32_t>> toks = {
        {1, 40, 41, 72, 100, 101, 102, 33, 3, 90, 91},
        {1, 40, 41, 72, 100, 101, 102, 33, 7, 8, 9, 10, 11},
        {1, 40, 41, 72, 100, 101, 102, 33, 3, 90, 55, 56}};
    const auto check_pools = [&] {
      for (int b = 0; b < 2; ++b) {
        std::vector<const std::vector<int32_t>*> tables;
        for (auto& k : caches[b]) tables.push_back(&k->blocks());
        Status st = pool[b]->check(tables);
        EXPECT_TRUE(st.ok()) << st.message();
      }
    };
    // Step 0: sequence 0's prompt. Then 1 and 2 adopt its blocks.
    for (int step = 0; step < 8; ++step) {
      std::vector<int> active = step < 6 ? std::vector<int>{0, 1, 2} : std::vector<int>{0};
      if (step == 0) active = {0};
      if (step == 1)
        for (int b = 0; b < 2; ++b) {
          const auto& t0 = caches[b][0]->blocks();
          ASSERT_TRUE(caches[b][1]->adopt({t0[0]}, 8).ok());
          ASSERT_TRUE(caches[b][2]->adopt({t0[0], t0[1]}, 10).ok());
        }
      std::vector<BatchSeqOutput> out[2];
      for (int b = 0; b < 2; ++b) {
        std::vector<BatchSeq> batch;
        for (int i : active) {
          const int len = caches[b][size_t(i)]->length();
          batch.push_back(BatchSeq{caches[b][size_t(i)].get(), toks[size_t(i)].data() + len,
                                   int(toks[size_t(i)].size()) - len, true, true});
        }
        Status st = forward_batch(*be[b], *model, batch, out[b]);
        ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.message();
      }
      check_pools();
      for (size_t j = 0; j < active.size(); ++j) {
        EXPECT_LE(max_abs_diff(out[0][j].logits, out[1][j].logits), kLogitTol)
            << "step " << step << " sequence " << active[j];
        EXPECT_LE(max_abs_diff(out[0][j].attention, out[1][j].attention), kProbTol)
            << "step " << step << " sequence " << active[j];
        const auto& l = out[0][j].logits;
        toks[size_t(active[j])].push_back(
            int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
      }
    }
    // Sequences 0 and 2 both wrote into the block they shared: the first writer (0, first
    // in the batch) copied it, once, on both backends; now each has its own.
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(caches[b][0]->cow_copies(), 1);
      EXPECT_EQ(caches[b][2]->cow_copies(), 0);
      EXPECT_NE(caches[b][0]->blocks()[1], caches[b][2]->blocks()[1]);
    }
    EXPECT_EQ(caches[0][0]->blocks(), caches[1][0]->blocks());
    EXPECT_EQ(caches[0][1]->blocks()[0], caches[0][0]->blocks()[0]);
  }
}

// The tiny gemma3 (local, local, global; window 5) on paged caches: three layer groups,
// the local ones giving back blocks outside the window after every step (holes in their
// tables that the kernels must step over). CUDA equals the CPU step by step for 30 steps.
TEST_F(CudaBackendParity, PagedWindowedGroupsMatchCpu) {
  const std::string path = tiny_path("pagedwin");
  ASSERT_TRUE(test::write_tiny_model(test::tiny_family("gemma3", 21), path).ok());
  auto loaded = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  std::shared_ptr<const Model> model = std::move(loaded.value());
  const KvCacheConfig cfg = kv_cache_config(*model, {}, KvPolicy::Full);
  const KvLayerGroups groups = kv_layer_groups(cfg);
  ASSERT_EQ(groups.count(), 3);
  const KvPoolConfig pc{{groups.size, model->config().n_head_kv, model->config().head_dim},
                        cfg.types, 8, 32};
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  auto cpu = make_cpu_backend(1);
  Backend* be[2] = {cpu.get(), cuda->get()};
  std::shared_ptr<KvPool> pool[2];
  std::unique_ptr<KvCache> cache[2];
  for (int b = 0; b < 2; ++b) {
    auto p = be[b]->create_kv_pool(pc);
    ASSERT_TRUE(p.ok()) << p.error().message;
    pool[b] = *p;
    auto k = be[b]->create_paged_kv_cache(cfg, pool[b]);
    ASSERT_TRUE(k.ok()) << k.error().message;
    cache[b] = std::move(*k);
  }
  std::vector<int32_t> toks = {1, 40, 41, 72, 100, 101, 102, 33, 3, 90, 91};
  int given_back = 0;
  for (int step = 0; step < 30; ++step) {
    std::vector<BatchSeqOutput> out[2];
    for (int b = 0; b < 2; ++b) {
      const int len = cache[b]->length();
      Status st = forward_batch(*be[b], *model,
                                {BatchSeq{cache[b].get(), toks.data() + len,
                                          int(toks.size()) - len, true, true}},
                                out[b]);
      ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.message();
      auto dropped = cache[b]->drop_outside_windows();
      ASSERT_TRUE(dropped.ok()) << dropped.error().message;
      if (b == 0) given_back += *dropped;
      std::vector<const std::vector<int32_t>*> tables;
      for (int g = 0; g < cache[b]->n_groups(); ++g) tables.push_back(&cache[b]->blocks(g));
      ASSERT_TRUE(pool[b]->check(tables).ok());
    }
    EXPECT_LE(max_abs_diff(out[0][0].logits, out[1][0].logits), kLogitTol) << "step " << step;
    EXPECT_LE(max_abs_diff(out[0][0].attention, out[1][0].attention), kProbTol) << "step " << step;
    const auto& l = out[0][0].logits;
    toks.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
  }
  // 41 positions: each local group gave back the blocks of positions 0..31.
  EXPECT_EQ(given_back, 2 * 4);
  EXPECT_EQ(cache[0]->blocks(0), cache[1]->blocks(0));
}

TEST_F(CudaBackendParity, OutOfMemoryIsAClearError) {
  test::TinyModelSpec spec;
  auto model = load_tiny(spec, "oom");
  ASSERT_TRUE(model);
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  // The emulated device has 8 GiB; ask for more.
  auto t = (*cuda)->scratch(0, int64_t(1) << 20, int64_t(1) << 12);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("out of GPU memory"), std::string::npos) << t.error().message;
  // Later allocations still work (out of memory is not sticky).
  EXPECT_TRUE((*cuda)->scratch(0, 4, 4).ok());
}

#endif

// ---- Programmatic dependent launch (PDL) ----------------------------------------------

// Sets an environment variable for its lifetime (restoring what was there).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) prev_ = v, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), prev_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, prev_;
  bool had_ = false;
};

// 16 greedy steps of a session (prompt, decode, device sampling) with PDL on equal the
// same run with it off bit for bit, eager and graphed: the attribute changes when a kernel
// may start, never what it computes. Emulated, on an sm_90 device; on a real GPU, PDL as
// the device allows (on for sm_90 and the kernels built for it): the kernels are
// deterministic (no float atomics), so a difference there means a missing wait.
TEST_F(CudaBackendParity, ProgrammaticLaunchSixteenStepsEqualPdlOff) {
#if !defined(KVSCOPE_REAL_GPU_TEST)
  EmulatedComputeCapability sm90(90);
#endif
  test::TinyModelSpec spec;
  spec.seed = 11;
  spec.n_embd = 96;  // head_dim 24
  std::shared_ptr<const Model> model = load_tiny(spec, "pdl_parity");
  ASSERT_TRUE(model);
  for (bool use_graph : {false, true}) {
    SCOPED_TRACE(use_graph ? "graph" : "no graph");
    std::vector<RunResult> runs;
    for (bool pdl : {false, true}) {
      CudaBackendOptions opt;
      opt.decode_graph = use_graph;
      opt.programmatic_launch = pdl;
      auto cuda = make_cuda_backend(*model, opt);
      ASSERT_TRUE(cuda.ok()) << cuda.error().message;
#if defined(KVSCOPE_REAL_GPU_TEST)
      EXPECT_FALSE(!pdl && name_says(**cuda, ", PDL on)")) << (*cuda)->name();
      if (pdl) std::printf("[ INFO     ] %s\n", (*cuda)->name().c_str());
      runs.push_back(run_session(model, std::move(cuda.value()), CacheMode::Cache, 16));
#else
      EXPECT_TRUE(name_says(**cuda, pdl ? ", PDL on)" : ", PDL off)")) << (*cuda)->name();
      const uint64_t k0 = kvscope::emu::kernels_run();
      const uint64_t p0 = kvscope::emu::programmatic_kernels_run();
      const uint64_t g0 = kvscope::emu::graph_launches();
      runs.push_back(run_session(model, std::move(cuda.value()), CacheMode::Cache, 16));
      const uint64_t kernels = kvscope::emu::kernels_run() - k0;
      EXPECT_GT(kernels, 16u);
      EXPECT_EQ(kvscope::emu::programmatic_kernels_run() - p0, pdl ? kernels : 0u);
      EXPECT_EQ(kvscope::emu::graph_launches() - g0, use_graph ? 15u : 0u);
#endif
    }
    ASSERT_EQ(runs[0].steps.size(), 16u);
    ASSERT_EQ(runs[1].steps.size(), 16u);
    for (size_t i = 0; i < 16; ++i) {
      EXPECT_EQ(runs[0].steps[i].token_id, runs[1].steps[i].token_id) << "step " << i;
      EXPECT_EQ(runs[0].logits[i], runs[1].logits[i]) << "step " << i;
      EXPECT_EQ(runs[0].steps[i].attention, runs[1].steps[i].attention) << "step " << i;
    }
  }
}

#if !defined(KVSCOPE_REAL_GPU_TEST)
// PDL stays off where it must: KVSCOPE_CUDA_PDL=0 on sm_90, the option off, and any device
// below compute capability 9.0 (whose name then says nothing about PDL).
TEST_F(CudaBackendParity, ProgrammaticLaunchOffByEnvOptionAndBelowSm90) {
  test::TinyModelSpec spec;
  auto model = load_tiny(spec, "pdl_off");
  ASSERT_TRUE(model);
  auto decode_step = [&](Backend& be) {
    auto cache = be.create_kv_cache(kv_cache_config(*model, {}, KvPolicy::Full), 8);
    ASSERT_TRUE(cache.ok());
    const int32_t tokens[3] = {1, 40, 41};
    ForwardOutput out;
    const uint64_t p0 = kvscope::emu::programmatic_kernels_run();
    const uint64_t k0 = kvscope::emu::kernels_run();
    ASSERT_TRUE(forward(be, *model, tokens, 2, 0, **cache, out).ok());
    ASSERT_TRUE(forward(be, *model, tokens + 2, 1, 2, **cache, out).ok());
    EXPECT_GT(kvscope::emu::kernels_run() - k0, 0u);
    EXPECT_EQ(kvscope::emu::programmatic_kernels_run() - p0, 0u) << be.name();
  };
  {
    EmulatedComputeCapability sm90(90);
    ScopedEnv off("KVSCOPE_CUDA_PDL", "0");
    auto cuda = make_cuda_backend(*model);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    EXPECT_TRUE(name_says(**cuda, ", PDL off)")) << (*cuda)->name();
    decode_step(**cuda);
  }
  {
    EmulatedComputeCapability sm90(90);
    CudaBackendOptions opt;
    opt.programmatic_launch = false;
    auto cuda = make_cuda_backend(*model, opt);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    EXPECT_TRUE(name_says(**cuda, ", PDL off)")) << (*cuda)->name();
    decode_step(**cuda);
  }
  for (int cc : {80, 86, 89}) {
    EmulatedComputeCapability older(cc);
    auto cuda = make_cuda_backend(*model);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    EXPECT_FALSE(name_says(**cuda, "PDL")) << (*cuda)->name();
    decode_step(**cuda);
  }
}
#endif

}  // namespace
}  // namespace kvscope
