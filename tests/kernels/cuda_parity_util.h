// cuda_parity_util.h — what the CUDA-backend parity tests share (test_cuda_backend.cpp,
// test_cuda_backend_kvquant.cpp): the tolerances against the CPU backend (explained in
// test_cuda_backend.cpp's header), tiny model files, the fixture that skips without a GPU
// in the real-GPU build and resets the emulator after each test, and a session runner.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "engine/cuda/cuda_backend.h"
#include "engine/model.h"
#include "engine/session.h"
#include "tests/util/skip_reason.h"
#include "tests/util/tiny_model.h"

namespace kvscope {

inline constexpr float kLogitTol = 2e-3f;
inline constexpr float kProbTol = 2e-4f;

// The largest allowed difference between the CPU's and the CUDA backend's norms of the
// stored K (or V) rows, `norms` being the CPU's. Derivation: both compute K = W·x in fp32 and
// differ only in summation order (relative ~1e-6, far below the f16 step), then store the
// row in the cache type. A value near an f16 rounding boundary can round to the neighbouring
// f16 value on one backend and not the other: at most one f16 step, 2^-10·|k_i|, per
// element, so in the worst case (every element of the row flips) the norms differ by
// 2^-10·|k| ≤ 9.8e-4·max|k|. Twice that, plus kLogitTol for the fp32 part and an f32 cache,
// is the bound: 2e-3·max|k| + 2e-3 (the earlier 1e-2·(1 + max|k|) was five times looser).
inline float kv_norm_tol(const std::vector<float>& norms) {
  const float max_norm = norms.empty() ? 0.0f : *std::max_element(norms.begin(), norms.end());
  return 2.0f * 0x1p-10f * max_norm + kLogitTol;
}

inline std::string tiny_path(const char* tag) {
  return (std::filesystem::temp_directory_path() /
          ("kvscope_cuda_" + std::string(tag) + "_" + std::to_string(getpid()) + ".gguf"))
      .string();
}

inline std::shared_ptr<Model> load_tiny(const test::TinyModelSpec& spec, const char* tag) {
  const std::string path = tiny_path(tag);
  EXPECT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto m = Model::load(path);
  std::filesystem::remove(path);  // the mapping stays valid after unlinking
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(m.value()) : nullptr;
}

class CudaBackendParity : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(KVSCOPE_REAL_GPU_TEST)
    auto probe = cuda_probe();
    if (!probe.ok())
      GTEST_SKIP() << test::kSkipNoGpu
                   << "no GPU for the real-CUDA parity test: " << probe.error().message;
#endif
  }
  void TearDown() override {
#if !defined(KVSCOPE_REAL_GPU_TEST)
    cudaDeviceReset();  // emulator: start every test with no allocations / sticky errors
#endif
  }
};

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Margin between the best and second-best logit.
inline float top2_margin(const std::vector<float>& l) {
  std::vector<float> s = l;
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return s[0] - s[1];
}

struct RunResult {
  std::vector<StepTrace> steps;
  std::vector<std::vector<float>> logits;
};

// A session of n_steps steps on the prompt "hi there" with K/V types `types`.
inline RunResult run_session(std::shared_ptr<const Model> model, std::unique_ptr<Backend> be,
                             CacheMode mode, int n_steps, KvTypes types,
                             const KvLimits& limits = {}) {
  RunResult r;
  SessionConfig cfg;
  cfg.mode = mode;
  cfg.kv_types = types;
  cfg.limits = limits;
  cfg.max_tokens = n_steps + 8;
  cfg.stop_at_eos = false;
  auto s = Session::create(std::move(model), std::move(be), cfg);
  EXPECT_TRUE(s.ok()) << s.error().message;
  if (!s.ok()) return r;
  PromptSpec p;
  p.text = "hi there";  // 8 byte-level tokens: the first forward is short (matvec)
  EXPECT_TRUE((*s)->reset(p).ok());
  for (int i = 0; i < n_steps && !(*s)->done(); ++i) {
    auto t = (*s)->step();
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) break;
    r.steps.push_back(std::move(t.value()));
    r.logits.push_back((*s)->last_logits());
  }
  return r;
}

inline RunResult run_session(std::shared_ptr<const Model> model, std::unique_ptr<Backend> be,
                             CacheMode mode, int n_steps, KvDtype dtype = KvDtype::F16,
                             const KvLimits& limits = {}) {
  return run_session(std::move(model), std::move(be), mode, n_steps, KvTypes{dtype, dtype}, limits);
}

}  // namespace kvscope
