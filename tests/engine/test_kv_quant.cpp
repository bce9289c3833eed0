// test_kv_quant.cpp — KV cache rows in q8_0 and q4_0: quantizing values chosen to be
// exact gives hand-built blocks byte for byte, those blocks load back to the values, a
// rounding case lands on the nearest step, and random rows come back within the stated
// error bound (half a step plus the scale's fp16 rounding; one step more at q4_0's
// clamped far end). On the CPU backend, attention over a quantized cache equals attention
// over an f32 cache holding the dequantized rows, for every K/V type pair.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv_quant.h"
#include "engine/quant.h"

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

}  // namespace
}  // namespace kvscope
