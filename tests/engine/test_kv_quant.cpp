// test_kv_quant.cpp — KV cache rows in q8_0 and q4_0: quantizing values chosen to be
// exact gives hand-built blocks byte for byte, those blocks load back to the values, a
// rounding case lands on the nearest step, and random rows come back within the stated
// error bound (half a step plus the scale's fp16 rounding; one step more at q4_0's
// clamped far end). On the CPU backend, attention over a quantized cache equals attention
// over an f32 cache holding the dequantized rows, for every K/V type pair. The error the
// engine measures for the app's error colouring is that of the rows as stored (recomputed
// here from the block functions), and a session measures it only when asked, without
// changing a token.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv_quant.h"
#include "engine/quant.h"
#include "engine/session.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

std::vector<uint8_t> store(GgmlType t, const std::vector<float>& x) {
  std::vector<uint8_t> b(row_bytes(t, x.size()), 0xAB);
  if (t == GgmlType::Q8_0) quantize_row_q8_0(x.data(), b.data(), int64_t(x.size()));
  if (t == GgmlType::Q4_0) quantize_row_q4_0(x.data(), b.data(), int64_t(x.size()));
  return b;
}

std::vector<float> load(GgmlType t, const std::vector<uint8_t>& b, int D) {
  std::vector<float> y(size_t(D), -1e30f);
  dequantize_row(t, b.data(), y.data(), D);
  return y;
}

TEST(KvQuant, Q8_0HandBuiltBlock) {
  // Values k·0.25 with max |k| = 127: d = 127·0.25/127 = 0.25 (fp16 0x3400), q = k.
  std::vector<float> x(32);
  std::vector<int8_t> k(32);
  for (int i = 0; i < 32; ++i) {
    k[size_t(i)] = int8_t(i * 8 - 127 + (i == 31 ? 6 : 0));  // -127 .. 127
    x[size_t(i)] = float(k[size_t(i)]) * 0.25f;
  }
  ASSERT_EQ(k[0], -127);
  ASSERT_EQ(k[31], 127);
  std::vector<uint8_t> want = {0x00, 0x34};
  for (int8_t q : k) want.push_back(uint8_t(q));
  EXPECT_EQ(store(GgmlType::Q8_0, x), want);
  EXPECT_EQ(load(GgmlType::Q8_0, want, 32), x);
  // 0.3 with the same scale rounds to 1 step (0.25), -0.4 to -2 steps (-0.5).
  x[5] = 0.3f;
  x[6] = -0.4f;
  const auto b = store(GgmlType::Q8_0, x);
  EXPECT_EQ(int8_t(b[2 + 5]), 1);
  EXPECT_EQ(int8_t(b[2 + 6]), -2);
  // An all-zero block has scale 0 and zero quants.
  const auto z = store(GgmlType::Q8_0, std::vector<float>(32, 0.0f));
  EXPECT_EQ(z, std::vector<uint8_t>(34, 0));
}

TEST(KvQuant, Q4_0HandBuiltBlocks) {
  // Block 0: the largest magnitude is -4 (negative): d = -4 / -8 = 0.5 (fp16 0x3800);
  // value i = (q_i - 8)·0.5 with q_i = i % 16. Byte j holds q_j (low) and q_{j+16} (high).
  // Block 1: the largest magnitude is +4: d = -0.5 (0xB800); value i = (q_i - 8)·(-0.5)
  // with q_i = 15 - (i % 16) except value 0 = +4 (q = 0).
  std::vector<float> x(64);
  std::vector<uint8_t> want(36);
  want[0] = 0x00;
  want[1] = 0x38;
  want[18] = 0x00;
  want[19] = 0xB8;
  for (int i = 0; i < 32; ++i) {
    const int q0 = i % 16;
    x[size_t(i)] = float(q0 - 8) * 0.5f;
    const int q1 = i == 0 ? 0 : 15 - (i % 16);
    x[size_t(32 + i)] = float(q1 - 8) * -0.5f;
  }
  for (int j = 0; j < 16; ++j) {
    want[size_t(2 + j)] = uint8_t((j % 16) | ((j % 16) << 4));
    const int lo = j == 0 ? 0 : 15 - j, hi = 15 - j;
    want[size_t(20 + j)] = uint8_t(lo | (hi << 4));
  }
  EXPECT_EQ(store(GgmlType::Q4_0, x), want);
  EXPECT_EQ(load(GgmlType::Q4_0, want, 64), x);
  // 1.2 with d = 0.5: 1.2/0.5 + 8.5 = 10.9 -> q = 10 -> 1.0 (the nearest step).
  x[3] = 1.2f;
  EXPECT_EQ(load(GgmlType::Q4_0, store(GgmlType::Q4_0, x), 64)[3], 1.0f);
}

TEST(KvQuant, RandomRowsWithinTheStatedBound) {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0}) {
    SCOPED_TRACE(type_traits(t)->name);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(128);
      for (float& f : x) f = n(rng);
      const auto b = store(t, x);
      const auto y = load(t, b, 128);
      for (int blk = 0; blk < 4; ++blk) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[size_t(32 * blk + i)]));
        // One quantization step of this block: the fp16 scale.
        uint16_t dh;
        std::memcpy(&dh, b.data() + blk * (t == GgmlType::Q8_0 ? 34 : 18), 2);
        const float step = std::fabs(fp16_to_fp32(dh));
        EXPECT_NEAR(step, amax / (t == GgmlType::Q8_0 ? 127.0f : 8.0f), 1e-3f * step);
        // Half a step, plus |q| times the fp16 rounding of the scale (2^-11 relative):
        // q8_0 |q| <= 127, q4_0 |q - 8| <= 8.
        const float q_bound =
            t == GgmlType::Q8_0 ? 0.5f + 127.0f * 0x1p-11f : 0.5f + 8.0f * 0x1p-11f;
        for (int i = 0; i < 32; ++i) {
          const size_t k = size_t(32 * blk + i);
          float bound = step * q_bound;
          // q4_0: q = 16 clamps to 15 at the end opposite the largest value.
          if (t == GgmlType::Q4_0 && std::fabs(x[k] - y[k]) > bound)
            bound = step * (q_bound + 0.5f);
          EXPECT_LE(std::fabs(x[k] - y[k]), bound) << "value " << k;
        }
      }
    }
  }
}

// Rows of a cache type, rounded the way the cache stores them, as fp32.
std::vector<float> through(KvDtype t, const std::vector<float>& x, int D) {
  if (t == KvDtype::F32) return x;
  std::vector<float> y(x.size());
  std::vector<uint8_t> b(kv_row_bytes(t, D));
  for (size_t r = 0; r < x.size() / size_t(D); ++r) {
    const float* src = x.data() + r * size_t(D);
    if (t == KvDtype::F16) {
      for (int i = 0; i < D; ++i) y[r * size_t(D) + size_t(i)] = fp16_to_fp32(fp32_to_fp16(src[i]));
      continue;
    }
    if (t == KvDtype::Q8_0) quantize_row_q8_0(src, b.data(), D);
    if (t == KvDtype::Q4_0) quantize_row_q4_0(src, b.data(), D);
    dequantize_row(GgmlType(int(t)), b.data(), y.data() + r * size_t(D), D);
  }
  return y;
}

TEST(KvQuant, CpuAttentionOverQuantizedRowsEqualsAttentionOverTheirValues) {
  constexpr int H = 4, Hkv = 2, D = 64, T = 7, N = 23;  // N positions cached, T queries at the end
  auto be = make_cpu_backend(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(size_t(N) * Hkv * D), v(k.size()), q(size_t(T) * H * D);
  for (float& f : k) f = nd(rng);
  for (float& f : v) f = nd(rng);
  for (float& f : q) f = nd(rng);
  const KvDtype all[] = {KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0};
  for (KvDtype kt : all)
    for (KvDtype vt : all) {
      const KvTypes types{kt, vt};
      SCOPED_TRACE(kv_types_name(types));
      // Attention of T queries at positions N-T .. N-1 over cache `c` holding k_rows, v_rows.
      auto run = [&](KvTypes ct, const std::vector<float>& kr, const std::vector<float>& vr) {
        auto made = be->create_kv_cache(kv_config_full({1, Hkv, D}, ct), N);
        EXPECT_TRUE(made.ok()) << made.error().message;
        KvCache& c = **made;
        auto ks = be->scratch(0, N, Hkv * D);
        auto vs = be->scratch(1, N, Hkv * D);
        std::copy(kr.begin(), kr.end(), ks->data);
        std::copy(vr.begin(), vr.end(), vs->data);
        EXPECT_TRUE(c.begin(0, N).ok());
        EXPECT_TRUE(be->kv_write(c, 0, *ks, *vs, 0).ok());
        EXPECT_TRUE(c.end().ok());
        auto qs = be->scratch(2, T, H * D);
        auto out = be->scratch(3, T, H * D);
        auto probs = be->scratch(4, H, N);
        std::copy(q.begin(), q.end(), qs->data);
        // The last T positions as queries: causal over the N cached keys.
        EXPECT_TRUE(be->attention(*qs, c, 0, N - T, H, 0.125f, *out, *probs).ok());
        std::vector<float> o(out->data, out->data + T * H * D);
        o.insert(o.end(), probs->data, probs->data + H * N);
        return o;
      };
      const auto got = run(types, k, v);
      const auto want = run({KvDtype::F32, KvDtype::F32}, through(kt, k, D), through(vt, v, D));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f + 1e-5f * std::fabs(want[i])) << "element " << i;
    }
}

// Backend::kv_row_errors is the relative error of each position's rows as the cache
// stores them (all KV heads together): recomputed here through the GGUF block functions;
// exactly 0 for an f32 cache, and growing f16 < q8_0 < q4_0.
TEST(KvQuant, CpuMeasuredRowErrorIsTheStoredRowsError) {
  constexpr int Hkv = 2, D = 64, N = 6;
  auto be = make_cpu_backend(1);
  ASSERT_TRUE(be->can_measure_kv_errors());
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(size_t(N) * Hkv * D), v(k.size());
  for (float& f : k) f = nd(rng);
  for (float& f : v) f = 3.0f * nd(rng);
  std::vector<double> mean;
  for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0}) {
    SCOPED_TRACE(kv_dtype_name(t));
    auto made = be->create_kv_cache(kv_config_full({1, Hkv, D}, {t, KvDtype::Q8_0}), N);
    ASSERT_TRUE(made.ok()) << made.error().message;
    KvCache& c = **made;
    auto ks = be->scratch(0, N, Hkv * D);
    auto vs = be->scratch(1, N, Hkv * D);
    std::copy(k.begin(), k.end(), ks->data);
    std::copy(v.begin(), v.end(), vs->data);
    ASSERT_TRUE(c.begin(0, N).ok());
    ASSERT_TRUE(be->kv_write(c, 0, *ks, *vs, 0).ok());
    ASSERT_TRUE(c.end().ok());
    auto ke = be->scratch(2, 1, N);
    auto ve = be->scratch(3, 1, N);
    ASSERT_TRUE(be->kv_row_errors(c, 0, 0, *ks, *vs, *ke, *ve).ok());
    const std::vector<float> kt = through(t, k, D), vt = through(KvDtype::Q8_0, v, D);
    double sum = 0;
    for (int n = 0; n < N; ++n) {
      auto rel = [&](const std::vector<float>& x, const std::vector<float>& y) {
        double d = 0, r = 0;
        for (size_t i = size_t(n) * Hkv * D; i < size_t(n + 1) * Hkv * D; ++i) {
          d += double(x[i] - y[i]) * (x[i] - y[i]);
          r += double(x[i]) * x[i];
        }
        return std::sqrt(d / r);
      };
      const double want_k = rel(k, kt), want_v = rel(v, vt);
      EXPECT_NEAR(ke->data[n], want_k, 1e-7 + 1e-4 * want_k) << "position " << n;
      EXPECT_NEAR(ve->data[n], want_v, 1e-7 + 1e-4 * want_v) << "position " << n;
      if (t == KvDtype::F32) {
        EXPECT_EQ(ke->data[n], 0.0f);
      }
      sum += ke->data[n];
    }
    mean.push_back(sum / N);
  }
  EXPECT_GT(mean[1], 0.0);
  EXPECT_LT(mean[1], mean[2]) << "f16 below q8_0";
  EXPECT_LT(mean[2], mean[3]) << "q8_0 below q4_0";
  EXPECT_GT(mean[2], 1e-3);  // q8_0: about 0.5% for Gaussian rows
  EXPECT_LT(mean[2], 2e-2);
  EXPECT_GT(mean[3], 2e-2);  // q4_0: about 10%
  EXPECT_LT(mean[3], 0.3);
}

// A session measures the errors only when asked (a normal run's traces carry none), for
// every row it writes, and the measurement changes no token.
TEST(KvQuant, SessionMeasuresRowErrorsOnlyWhenAskedWithTheSameTokens) {
  test::TinyModelSpec spec;
  spec.n_head = 2;  // head_dim 32: one quantized block per head
  spec.n_head_kv = 1;
  const std::string path =
      ::testing::TempDir() + "/kvscope_tiny_kv_errors." + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto model = Model::load(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::vector<int32_t> tokens[2];
  for (int on = 0; on < 2; ++on) {
    SessionConfig cfg;
    cfg.kv_types = {KvDtype::Q8_0, KvDtype::Q4_0};
    cfg.max_tokens = 6;
    cfg.stop_at_eos = false;
    cfg.kv_errors = on == 1;
    auto s = Session::create(model.value(), make_cpu_backend(1), cfg);
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_TRUE((*s)->reset_tokens({5, 6, 7, 8, 9}).ok());
    while (!(*s)->done()) {
      auto t = (*s)->step();
      ASSERT_TRUE(t.ok()) << t.error().message;
      tokens[on].push_back(t->token_id);
      const size_t rows = size_t(t->n_layer) * size_t(t->kv_written);
      ASSERT_EQ(t->k_err.size(), on ? rows : 0u) << "step " << t->step;
      ASSERT_EQ(t->v_err.size(), on ? rows : 0u) << "step " << t->step;
      for (size_t i = 0; i < t->k_err.size(); ++i) {
        EXPECT_GT(t->k_err[i], 0.0f);
        EXPECT_LT(t->k_err[i], 0.05f) << "q8_0";
        EXPECT_GT(t->v_err[i], t->k_err[i]) << "q4_0 loses more than q8_0";
      }
    }
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

}  // namespace
}  // namespace kvscope
