// test_cuda_backend_kvquant.cpp — the CUDA backend with q8_0 / q4_0 KV caches (K and V
// types chosen apart) against the CPU backend, on tiny random-weight models whose head dim
// is a whole q8_0 / q4_0 block (32).
//
// Built twice, as test_cuda_backend.cpp: on the CPU emulation layer (every CI run) and
// against the real CUDA build (skips where no GPU is usable).
//
// What is exact and what is not: for the same fp32 rows the CUDA kernels store the very
// bytes the CPU stores and read the same dequantized values (test_kernel_kv_quant), but
// the two backends compute K and V with fp32 noise (summation order, rsqrt, RoPE fmas).
// A value within that noise of a rounding boundary of the cache type lands on different
// sides on the two backends, and the cache then differs by one step of the type in that
// value — a q8_0 step is amax/127 of its block, a q4_0 step amax/8, against 2^-11 of the
// value for f16. These models' logits are of magnitude ~10, so one such flip moves them
// by more than the f32-noise tolerance of test_cuda_backend.cpp (kLogitTol 2e-3; even its
// f16 cache differs by 1.9e-3 on the 128-wide model here). Measured on the emulator over
// the runs below: logits differ by at most 9.6e-3 and attention rows by 5.2e-3 (K q8_0 /
// V f16, where f16 flips of V dominate); q8_0 / q8_0 by 1.2e-5. The tolerances:
//  - kQuantLogitTol 3e-2 and kQuantProbTol 1.5e-2: a few flips' worth (~3x the worst seen);
//    still two orders of magnitude below what quantizing the cache itself changes (q8_0
//    vs f16: 5e-2 .. 0.18 on the same steps; q4_0: 1.5 .. 7.5);
//  - tokens: greedy choices must match, except where the CPU's best two logits are within
//    2 x kQuantLogitTol (a near-tie such a flip could turn);
//  - KV_CACHE: kv_bytes equal the CPU's at every step and are exactly the blocks of 16
//    positions that hold the sequence, L x Hkv x (K row bytes + V row bytes) per position
//    (q8_0: 34 B per 32 values, q4_0: 18 B).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/kv_cache.h"
#include "tests/kernels/cuda_parity_util.h"
#include "tests/util/sanitizer.h"
#include "tests/util/tiny_model.h"
#if !defined(KVSCOPE_REAL_GPU_TEST)
#include "kernels/emu/emu.h"
#endif

namespace kvscope {
namespace {

class CudaKvQuantParity : public CudaBackendParity {};

constexpr float kQuantLogitTol = 3e-2f;
constexpr float kQuantProbTol = 1.5e-2f;

// The default tiny llama but 128 wide: 4 heads of 32 over 2 kv heads (GQA).
test::TinyModelSpec llama32(uint32_t seed) {
  test::TinyModelSpec spec;
  spec.n_embd = 128;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.seed = seed;
  return spec;
}

std::string types_name(KvTypes t) {
  return std::string("k=") + kv_dtype_name(t.k) + ",v=" + kv_dtype_name(t.v);
}

// a (CPU) and b (CUDA) step by step: tokens (near-tie rule), logits, attention rows,
// K/V norms, FLOPs and KV bytes (with every layer full, the blocks of 16 positions that hold
// the sequence);
// returns the number of steps compared.
size_t compare_runs(const RunResult& a, const RunResult& b, const Model& m, KvTypes types,
                    CacheMode mode, bool full_layers = true) {
  EXPECT_EQ(a.steps.size(), b.steps.size());
  const ModelConfig& c = m.config();
  const uint64_t per_layer_position = uint64_t(c.n_head_kv) * (kv_row_bytes(types.k, c.head_dim) +
                                                               kv_row_bytes(types.v, c.head_dim));
  const uint64_t per_position = uint64_t(c.n_layer) * per_layer_position;
  size_t i = 0;
  float worst_logit = 0, worst_prob = 0;
  for (; i < std::min(a.steps.size(), b.steps.size()); ++i) {
    const StepTrace &x = a.steps[i], &y = b.steps[i];
    if (x.token_id != y.token_id) {
      EXPECT_LT(top2_margin(a.logits[i]), 2 * kQuantLogitTol)
          << "step " << i << " chose " << y.token_id << " instead of " << x.token_id;
      break;
    }
    worst_logit = std::max(worst_logit, max_abs_diff(a.logits[i], b.logits[i]));
    worst_prob = std::max(worst_prob, max_abs_diff(x.attention, y.attention));
    EXPECT_LE(max_abs_diff(a.logits[i], b.logits[i]), kQuantLogitTol) << "step " << i;
    EXPECT_LE(max_abs_diff(x.attention, y.attention), kQuantProbTol) << "step " << i;
    if (!x.k_norm.empty()) {
      const float kmax = *std::max_element(x.k_norm.begin(), x.k_norm.end());
      const float vmax = *std::max_element(x.v_norm.begin(), x.v_norm.end());
      EXPECT_LE(max_abs_diff(x.k_norm, y.k_norm), 1e-2f * (1 + kmax)) << "step " << i;
      EXPECT_LE(max_abs_diff(x.v_norm, y.v_norm), 1e-2f * (1 + vmax)) << "step " << i;
    }
    EXPECT_EQ(x.flops, y.flops) << "step " << i;
    EXPECT_EQ(x.shift_n, y.shift_n) << "step " << i;
    EXPECT_EQ(x.kv_bytes, y.kv_bytes) << "step " << i;
    if (mode == CacheMode::Cache) {
      EXPECT_EQ(y.kv_bytes % per_layer_position, 0u) << "step " << i;
      if (full_layers) {
        const uint64_t n = uint64_t(y.seq_len - 1);  // positions through the cache
        EXPECT_EQ(y.kv_bytes, (n + 15) / 16 * 16 * per_position) << "step " << i;
      }
    }
  }
  std::printf("%s %s: largest difference CUDA vs CPU: logits %.2e, attention %.2e\n",
              types_name(types).c_str(), cache_mode_name(mode), worst_logit, worst_prob);
  return i;
}

// One K/V type pair in both cache modes: the CUDA session gives the CPU's tokens, logits
// and KV bytes for 8 steps, and CUDA's CACHE and NO CACHE give the same tokens.
void check_types_in_both_modes(KvTypes types) {
  std::shared_ptr<const Model> model = load_tiny(llama32(7), "kvq");
  ASSERT_TRUE(model);
  ASSERT_EQ(model->config().head_dim, 32);
  std::vector<RunResult> gpu;
  for (CacheMode mode : {CacheMode::Cache, CacheMode::NoCache}) {
    SCOPED_TRACE(types_name(types) + " " + cache_mode_name(mode));
    auto cuda = make_cuda_backend(*model);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    RunResult a = run_session(model, make_cpu_backend(1), mode, 8, types);
    RunResult b = run_session(model, std::move(cuda.value()), mode, 8, types);
    ASSERT_EQ(a.steps.size(), 8u);
    ASSERT_EQ(b.steps.size(), 8u);
    // This seed has no near-tie: every step is compared.
    EXPECT_EQ(compare_runs(a, b, *model, types, mode), 8u);
    gpu.push_back(std::move(b));
  }
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(gpu[0].steps[i].token_id, gpu[1].steps[i].token_id)
        << types_name(types) << ": CUDA CACHE vs NO CACHE step " << i;
}

TEST_F(CudaKvQuantParity, Q8_0CacheMatchesCpuInBothModes) {
  check_types_in_both_modes({KvDtype::Q8_0, KvDtype::Q8_0});
}

TEST_F(CudaKvQuantParity, Q4_0CacheMatchesCpuInBothModes) {
  check_types_in_both_modes({KvDtype::Q4_0, KvDtype::Q4_0});
}

TEST_F(CudaKvQuantParity, Q8_0KeysF16ValuesMatchCpuInBothModes) {
  check_types_in_both_modes({KvDtype::Q8_0, KvDtype::F16});
}

// The fused decode step (4 launches per layer: the residual steps fused into
// norm_qkv_kv_write and norm_ffn, attention merged in its own launch) against the CPU over
// 16 steps (8 under ASan), for the tiny llama (the default model's features) and the tiny Gemma 3
// (q/k norms, post norms, windows, GELU), f16 and q8_0 caches, CACHE (the fused kernels, one graph
// per step) and NO CACHE (the unfused composition over the whole sequence): the CPU's tokens,
// logits and attention rows within this file's tolerances, and CUDA's two modes agree on the
// tokens.
TEST_F(CudaKvQuantParity, FusedDecodeStepsMatchCpuForLlamaAndGemma3) {
  test::TinyModelSpec gspec = test::tiny_family("gemma3", 41);
  gspec.head_dim = 32;
  const std::string path = tiny_path("fused_gemma3");
  ASSERT_TRUE(test::write_tiny_model(gspec, path).ok());
  auto g = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(g.ok()) << g.error().message;
  const std::shared_ptr<const Model> models[2] = {load_tiny(llama32(13), "fused_llama"),
                                                  std::move(g.value())};
  // 8 steps under ASan (tests/util/sanitizer.h): the same kernels, half the steps.
  const int n = test::kAddressSanitizer ? 8 : 16;
  for (const std::shared_ptr<const Model>& model : models) {
    ASSERT_TRUE(model);
    for (KvDtype dt : {KvDtype::F16, KvDtype::Q8_0}) {
      const KvTypes types{dt, dt};
      std::vector<RunResult> gpu;
      for (CacheMode mode : {CacheMode::Cache, CacheMode::NoCache}) {
        SCOPED_TRACE(model->config().arch + " " + types_name(types) + " " +
                     cache_mode_name(mode));
        auto cuda = make_cuda_backend(*model);
        ASSERT_TRUE(cuda.ok()) << cuda.error().message;
        RunResult a = run_session(model, make_cpu_backend(1), mode, n, types);
        RunResult b = run_session(model, std::move(cuda.value()), mode, n, types);
        ASSERT_EQ(a.steps.size(), size_t(n));
        ASSERT_EQ(b.steps.size(), size_t(n));
        const bool full = model->config().arch == "llama";  // Gemma 3's windows free blocks
        EXPECT_EQ(compare_runs(a, b, *model, types, mode, full), size_t(n));
        gpu.push_back(std::move(b));
      }
      for (size_t i = 0; i < size_t(n); ++i)
        EXPECT_EQ(gpu[0].steps[i].token_id, gpu[1].steps[i].token_id)
            << model->config().arch << " " << types_name(types) << ": CACHE vs NO CACHE step "
            << i;
    }
  }
}

// Tiny Gemma 3 (windows of 5 on its local layers, MQA, NeoX RoPE) with head dim 32,
// K q4_0 and V q8_0: ring caches, the decode graph and the windowed attention read the
// quantized rows as the CPU does.
TEST_F(CudaKvQuantParity, Gemma3RingsWithQuantizedCacheMatchCpu) {
  test::TinyModelSpec spec = test::tiny_family("gemma3", 31);
  spec.head_dim = 32;
  const std::string path = tiny_path("kvq_gemma3");
  ASSERT_TRUE(test::write_tiny_model(spec, path).ok());
  auto m = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::shared_ptr<const Model> model = std::move(m.value());
  const KvTypes types{KvDtype::Q4_0, KvDtype::Q8_0};
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  RunResult a = run_session(model, make_cpu_backend(1), CacheMode::Cache, 12, types);
#if !defined(KVSCOPE_REAL_GPU_TEST)
  const uint64_t graphs0 = kvscope::emu::graph_launches();
#endif
  RunResult b = run_session(model, std::move(cuda.value()), CacheMode::Cache, 12, types);
#if !defined(KVSCOPE_REAL_GPU_TEST)
  EXPECT_EQ(kvscope::emu::graph_launches() - graphs0, 11u) << "every decode step one graph";
#endif
  ASSERT_EQ(a.steps.size(), 12u);
  ASSERT_EQ(b.steps.size(), 12u);
  EXPECT_EQ(compare_runs(a, b, *model, types, CacheMode::Cache, /*full_layers=*/false), 12u);
}

// Context shifts with a q8_0 K cache (V f16) on the tiny llama, keeping 2 positions: the
// re-rotation (kernels/kv_rerotate.cu) dequantizes, rotates and requantizes the surviving
// K rows as the CPU does; CUDA matches the CPU through several shifts. (CACHE mode: the
// mode whose cache is shifted and re-rotated.)
TEST_F(CudaKvQuantParity, ContextShiftWithQ8_0KeysMatchesCpu) {
  std::shared_ptr<const Model> model = load_tiny(llama32(9), "kvq_shift");
  ASSERT_TRUE(model);
  const KvTypes types{KvDtype::Q8_0, KvDtype::F16};
  for (CacheMode mode : {CacheMode::Cache}) {
    SCOPED_TRACE(cache_mode_name(mode));
    KvLimits lim;
    lim.n_ctx = 12;
    lim.on_full = ContextPolicy::Shift;
    lim.n_keep = 2;
    auto cuda = make_cuda_backend(*model);
    ASSERT_TRUE(cuda.ok()) << cuda.error().message;
    RunResult a = run_session(model, make_cpu_backend(1), mode, 14, types, lim);
    RunResult b = run_session(model, std::move(cuda.value()), mode, 14, types, lim);
    ASSERT_EQ(a.steps.size(), 14u);
    ASSERT_EQ(b.steps.size(), 14u);
    EXPECT_EQ(compare_runs(a, b, *model, types, mode), 14u);
    int shifts = 0;
    for (const StepTrace& s : a.steps) shifts += s.shift_n > 0;
    EXPECT_GE(shifts, 2);
  }
}

// The quantization error of the stored rows (the scene's error colouring), measured on the
// device from the stored bytes (kernels/kv_row_errors.cu): per layer and written position
// the CUDA backend's K and V errors equal the CPU's for the same run within 10% (the rows
// differ by fp32 noise, which can move a value across a rounding boundary), an f32 side
// is exactly 0, and q4_0 loses more than q8_0.
TEST_F(CudaKvQuantParity, RowErrorsMatchTheCpu) {
  std::shared_ptr<const Model> model = load_tiny(llama32(7), "kverr");
  ASSERT_TRUE(model);
  for (const KvTypes types : {KvTypes{KvDtype::Q8_0, KvDtype::Q4_0},
                              KvTypes{KvDtype::F32, KvDtype::Q8_0}}) {
    SCOPED_TRACE(types_name(types));
    std::vector<StepTrace> runs[2];
    for (int gpu = 0; gpu < 2; ++gpu) {
      std::unique_ptr<Backend> be = make_cpu_backend(1);
      if (gpu == 1) {
        auto cuda = make_cuda_backend(*model);
        ASSERT_TRUE(cuda.ok()) << cuda.error().message;
        be = std::move(cuda.value());
      }
      SessionConfig cfg;
      cfg.kv_types = types;
      cfg.max_tokens = 6;
      cfg.stop_at_eos = false;
      cfg.kv_errors = true;
      auto s = Session::create(model, std::move(be), cfg);
      ASSERT_TRUE(s.ok()) << s.error().message;
      ASSERT_TRUE((*s)->reset_tokens({5, 6, 7, 8, 9}).ok());
      while (!(*s)->done()) {
        auto t = (*s)->step();
        ASSERT_TRUE(t.ok()) << t.error().message;
        runs[gpu].push_back(std::move(t.value()));
      }
    }
    ASSERT_EQ(runs[0].size(), 6u);
    ASSERT_EQ(runs[1].size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      const StepTrace &a = runs[0][i], &b = runs[1][i];
      ASSERT_EQ(a.token_id, b.token_id) << "step " << i;
      ASSERT_EQ(a.k_err.size(), size_t(a.n_layer) * size_t(a.kv_written)) << "step " << i;
      ASSERT_EQ(b.k_err.size(), a.k_err.size()) << "step " << i;
      ASSERT_EQ(b.v_err.size(), a.v_err.size()) << "step " << i;
      for (size_t r = 0; r < a.k_err.size(); ++r) {
        EXPECT_NEAR(b.k_err[r], a.k_err[r], 0.1f * a.k_err[r]) << "step " << i << " row " << r;
        EXPECT_NEAR(b.v_err[r], a.v_err[r], 0.1f * a.v_err[r]) << "step " << i << " row " << r;
        if (types.k == KvDtype::F32) {
          EXPECT_EQ(b.k_err[r], 0.0f) << "step " << i << " row " << r;
        } else {
          EXPECT_GT(b.k_err[r], 0.0f);
          EXPECT_LT(b.k_err[r], b.v_err[r]) << "q8_0 K loses less than q4_0 V";
        }
      }
    }
  }
}

// The CUDA backend now accepts every cache type the CPU does; a head dim that is not a
// whole number of blocks is refused with a clear message, as on the CPU.
TEST_F(CudaKvQuantParity, CacheTypesAcceptedAndBadShapesRefused) {
  test::TinyModelSpec spec;  // head dim 16
  auto model = load_tiny(spec, "kvq_bad");
  ASSERT_TRUE(model);
  auto cuda = make_cuda_backend(*model);
  ASSERT_TRUE(cuda.ok()) << cuda.error().message;
  const ModelConfig& c = model->config();
  const KvShape shape{c.n_layer, c.n_head_kv, c.head_dim};
  auto cpu = make_cpu_backend(1);
  for (KvDtype t : {KvDtype::F32, KvDtype::F16})
    EXPECT_TRUE((*cuda)->create_kv_cache(kv_config_full(shape, {t, t}), 4).ok());
  for (KvDtype t : {KvDtype::Q8_0, KvDtype::Q4_0}) {
    auto g = (*cuda)->create_kv_cache(kv_config_full(shape, {t, KvDtype::F16}), 4);
    auto h = cpu->create_kv_cache(kv_config_full(shape, {t, KvDtype::F16}), 4);
    EXPECT_EQ(g.ok(), h.ok()) << kv_dtype_name(t);
    EXPECT_FALSE(g.ok()) << kv_dtype_name(t) << " with head dim " << c.head_dim;
  }
  const KvShape shape32{2, 2, 32};
  for (KvDtype k : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0})
    for (KvDtype v : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0}) {
      auto g = (*cuda)->create_kv_cache(kv_config_full(shape32, {k, v}), 4);
      EXPECT_TRUE(g.ok()) << kv_dtype_name(k) << "/" << kv_dtype_name(v) << ": "
                          << (g.ok() ? "" : g.error().message);
    }
}

}  // namespace
}  // namespace kvscope
