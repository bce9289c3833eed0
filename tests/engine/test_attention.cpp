// test_attention.cpp — the CPU backend's attention on every dispatch path (AVX-512, AVX2,
// scalar; forced with set_isa): against a float64 reference computed from the stored
// K/V rows, for f32 and f16 caches, head sizes 64, 128, 256 and an odd one, GQA groups of
// 1 to 5 heads, windows with sinks, and contexts long enough for many position chunks;
// and the invariant that keeps KV CACHE and NO CACHE identical: every query's output and
// attention row are the same bits whether it runs alone against a cache filled one
// position at a time (decode, a ring for windowed layers) or inside one batch of all
// queries (NO CACHE's scratch cache), with 1, 2 or 3 threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/quant.h"
#include "tests/util/isa_paths.h"

namespace kvscope {
namespace {

using cpu::Isa;

struct Case {
  int D, Hkv, G, n;  // head size, KV heads, heads per group, positions
  KvTypes types;
  KvLayerRule rule;  // window / sink (keep is set per cache)
};

std::string describe(const Case& c) {
  return "D=" + std::to_string(c.D) + " Hkv=" + std::to_string(c.Hkv) +
         " G=" + std::to_string(c.G) + " n=" + std::to_string(c.n) + " " + kv_types_name(c.types) +
         " window=" + std::to_string(c.rule.window) + " sink=" + std::to_string(c.rule.sink);
}

// Random K/V rows and queries for a case.
struct Data {
  std::vector<float> k, v, q;  // [n][Hkv*D], [n][Hkv*D], [n][H*D]
};
Data random_data(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> u(0.0f, 1.0f);
  Data d;
  d.k.resize(size_t(c.n) * c.Hkv * c.D);
  d.v.resize(d.k.size());
  d.q.resize(size_t(c.n) * c.Hkv * c.G * c.D);
  for (float& x : d.k) x = u(rng);
  for (float& x : d.v) x = u(rng);
  for (float& x : d.q) x = u(rng);
  return d;
}

// What a value looks like after a trip through the cache type.
float stored(KvDtype t, float x) {
  return t == KvDtype::F16 ? fp16_to_fp32(fp32_to_fp16(x)) : x;
}

struct Result {
  std::vector<float> out;    // [T][H*D]
  std::vector<float> probs;  // [H][n] of the last query
};

// Writes positions [pos0, pos0 + T) of d into layer 0, then attends the T queries.
Result attend(Backend& be, KvCache& cache, const Case& c, const Data& d, int pos0, int T) {
  const int H = c.Hkv * c.G, kv_cols = c.Hkv * c.D;
  Result r;
  EXPECT_TRUE(cache.begin(pos0, T).ok());
  auto k = be.scratch(0, T, kv_cols), v = be.scratch(1, T, kv_cols), q = be.scratch(2, T, H * c.D);
  auto out = be.scratch(3, T, H * c.D), probs = be.scratch(4, H, pos0 + T);
  EXPECT_TRUE(k.ok() && v.ok() && q.ok() && out.ok() && probs.ok());
  std::copy_n(d.k.begin() + int64_t(pos0) * kv_cols, T * kv_cols, k->data);
  std::copy_n(d.v.begin() + int64_t(pos0) * kv_cols, T * kv_cols, v->data);
  std::copy_n(d.q.begin() + int64_t(pos0) * H * c.D, T * H * c.D, q->data);
  EXPECT_TRUE(be.kv_write(cache, 0, *k, *v, pos0).ok());
  // The rows start as garbage: attention writes every position of them, 0 where the
  // query does not look (past its window, before its sinks' end).
  std::fill_n(probs->data, probs->size(), std::nanf(""));
  const float scale = 1.0f / std::sqrt(float(c.D));
  Status s = be.attention(*q, cache, 0, pos0, H, scale, *out, *probs);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  EXPECT_TRUE(cache.end().ok());
  r.out.assign(out->data, out->data + T * H * c.D);
  r.probs.assign(probs->data, probs->data + H * (pos0 + T));
  return r;
}

KvCacheConfig config_for(const Case& c, bool ring) {
  KvCacheConfig cfg = kv_config_full({1, c.Hkv, c.D}, c.types);
  cfg.layers[0] = c.rule;
  if (ring && c.rule.window > 0) cfg.layers[0].keep = c.rule.window;
  if (!ring) cfg = kv_config_scratch(cfg);
  return cfg;
}

// float64 attention of query qp (all heads) over the stored rows.
void reference(const Case& c, const Data& d, int qp, std::vector<double>& out,
               std::vector<double>& probs) {
  const int H = c.Hkv * c.G, kv_cols = c.Hkv * c.D;
  out.assign(size_t(H) * c.D, 0.0);
  probs.assign(size_t(H) * (qp + 1), 0.0);
  for (int h = 0; h < H; ++h) {
    const int hk = h / c.G;
    std::vector<double> s(size_t(qp + 1), -INFINITY);
    double mx = -INFINITY;
    for (int j = 0; j <= qp; ++j) {
      if (!c.rule.visible(j, qp)) continue;
      double dot = 0;
      for (int i = 0; i < c.D; ++i)
        dot += double(d.q[size_t(qp) * H * c.D + h * c.D + i]) *
               stored(c.types.k, d.k[size_t(j) * kv_cols + hk * c.D + i]);
      s[size_t(j)] = dot / std::sqrt(double(c.D));
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    for (int j = 0; j <= qp; ++j)
      sum += std::isinf(s[size_t(j)]) ? 0.0 : std::exp(s[size_t(j)] - mx);
    for (int j = 0; j <= qp; ++j) {
      const double p = std::isinf(s[size_t(j)]) ? 0.0 : std::exp(s[size_t(j)] - mx) / sum;
      probs[size_t(h) * (qp + 1) + j] = p;
      for (int i = 0; i < c.D; ++i)
        out[size_t(h) * c.D + i] += p * stored(c.types.v, d.v[size_t(j) * kv_cols + hk * c.D + i]);
    }
  }
}

const Case kCases[] = {
    {64, 3, 3, 300, {KvDtype::F16, KvDtype::F16}, {}},           // the default model's shape
    {64, 2, 1, 150, {KvDtype::F32, KvDtype::F32}, {}},           // no grouping
    {128, 1, 5, 140, {KvDtype::F16, KvDtype::F32}, {}},          // mixed types, odd group
    {256, 1, 4, 200, {KvDtype::F16, KvDtype::F16}, {64, 0, 0}},  // Gemma-like local layer
    {64, 2, 2, 400, {KvDtype::F16, KvDtype::F16}, {100, 4, 0}},  // window with sinks
    {24, 2, 2, 70, {KvDtype::F32, KvDtype::F16}, {}},            // odd head size
};

// The cases, shortened under a CPU emulator (tests/util/isa_paths.h) to at most 120
// positions: still past every case's window (and the ring's 8 slots) and the prompt of 37.
std::vector<Case> cases() {
  std::vector<Case> out(std::begin(kCases), std::end(kCases));
  if (test::emulated_cpu())
    for (Case& c : out) c.n = std::min(c.n, 120);
  return out;
}

// Every test here runs once per path (".../scalar", ".../avx2", ".../avx512"); a path this
// CPU lacks is reported as skipped (tests/util/isa_paths.h).
class Attention : public test::IsaPathTest {};
KVSCOPE_TEST_EVERY_ISA(Attention);

TEST_P(Attention, MatchesAFloat64Reference) {
  const Isa isa = this->isa();
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + describe(c));
    auto be = make_cpu_backend(2);
    const Data d = random_data(c, 17);
    auto cache = be->create_kv_cache(config_for(c, false), c.n);
    ASSERT_TRUE(cache.ok());
    const Result r = attend(*be, **cache, c, d, 0, c.n);
    const int H = c.Hkv * c.G;
    std::vector<double> want, want_p;
    double worst = 0;
    for (int qp : {0, 1, c.n / 3, c.n - 1}) {
      reference(c, d, qp, want, want_p);
      for (size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::fabs(r.out[size_t(qp) * H * c.D + i] - want[i]));
    }
    EXPECT_LT(worst, 2e-5) << "largest output difference";
    // The last query's attention rows, by position.
    reference(c, d, c.n - 1, want, want_p);
    double sum0 = 0;
    for (int j = 0; j < c.n; ++j) {
      for (int h = 0; h < H; ++h)
        ASSERT_NEAR(r.probs[size_t(h) * c.n + j], want_p[size_t(h) * c.n + j], 2e-6) << "pos " << j;
      sum0 += r.probs[size_t(j)];
    }
    EXPECT_NEAR(sum0, 1.0, 1e-5);
  }
}

TEST_P(Attention, EachQueryGivesTheSameBitsAloneOrInABatchWithAnyThreads) {
  const Isa isa = this->isa();
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + describe(c));
    const Data d = random_data(c, 5);
    const int H = c.Hkv * c.G;
    // NO CACHE: all queries in one batch on a scratch cache.
    auto be = make_cpu_backend(2);
    auto scratch = be->create_kv_cache(config_for(c, false), c.n);
    ASSERT_TRUE(scratch.ok());
    const Result batch = attend(*be, **scratch, c, d, 0, c.n);
    // CACHE: a prompt of 37, then one position at a time (windowed layers in a ring).
    for (int threads : {1, 3}) {
      auto be1 = make_cpu_backend(threads);
      auto ring = be1->create_kv_cache(config_for(c, true), 8);
      ASSERT_TRUE(ring.ok());
      const Result prompt = attend(*be1, **ring, c, d, 0, 37);
      for (int i = 0; i < 37 * H * c.D; ++i) ASSERT_EQ(prompt.out[size_t(i)], batch.out[size_t(i)]);
      for (int p = 37; p < c.n; ++p) {
        const Result one = attend(*be1, **ring, c, d, p, 1);
        for (int i = 0; i < H * c.D; ++i)
          ASSERT_EQ(one.out[size_t(i)], batch.out[size_t(p) * H * c.D + i])
              << threads << " threads, query " << p;
        if (p == c.n - 1) {
          EXPECT_EQ(one.probs, batch.probs) << "the last query's attention rows";
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvscope
