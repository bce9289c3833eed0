// test_kernel_ops.cpp — RMSNorm, RoPE (adjacent, NeoX, scaled), gated activations, bias
// and residual adds, KV append, KV row norms and
// attention under the CUDA emulator against CPU references in double.
//
// Tolerances (relative to the magnitudes involved):
//  - rmsnorm 2e-6: fp32 block-tree sum of squares vs a double sum, one rsqrt.
//  - rope 2e-6: the angle is formed in double on both sides; only the fp32 rotate differs.
//  - glu (SiLU, tanh-GELU) 1e-6 relative + 1e-6 absolute: expf/tanhf on the emulator are
//    libm's, the rest fp32 arithmetic.
//  - add, add_bias: exact.
//  - kv_write / kv_row_norms: fp16 storage is exactly round-to-nearest (compared bit-exact);
//    norms 2e-6 (fp32 sums).
//  - attention 2e-6 absolute on probabilities and 1e-5 on outputs of magnitude ~1: fp32
//    dot products of D terms and a softmax over N keys vs double.
#include <cstring>

#include "engine/quant.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

using kvscope::test::all_close;
using kvscope::test::DevVec;
using kvscope::test::random_floats;

class KernelOps : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

TEST_F(KernelOps, RmsnormMatchesReferenceForOddWidths) {
  for (int C : {7, 100, 1500}) {
    const int T = 3;
    const auto x = random_floats(size_t(T * C), 1, -2.f, 2.f);
    const auto w = random_floats(size_t(C), 2, 0.5f, 1.5f);
    DevVec<float> dx(x), dw(w), out(size_t(T * C));
    ASSERT_EQ(kvscope::cuda::rmsnorm(dx.p, dw.p, T, C, 1e-5f, out.p, nullptr), cudaSuccess)
        << kvscope::cuda::error_detail();
    std::vector<float> want(x.size());
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < C; ++i) ss += double(x[t * C + i]) * x[t * C + i];
      const double s = 1.0 / std::sqrt(ss / C + 1e-5);
      for (int i = 0; i < C; ++i) want[t * C + i] = float(x[t * C + i] * s * w[i]);
    }
    EXPECT_TRUE(all_close(out.get(), want, 1e-7f, 2e-6f)) << "C " << C;
    // In place (out aliases x), as the forward uses it for the final norm.
    ASSERT_EQ(kvscope::cuda::rmsnorm(dx.p, dw.p, T, C, 1e-5f, dx.p, nullptr), cudaSuccess);
    EXPECT_TRUE(all_close(dx.get(), want, 1e-7f, 2e-6f)) << "in place C " << C;
  }
}

TEST_F(KernelOps, RopeRotatesAdjacentOrNeoxPairsAtLargePositions) {
  const int T = 5, H = 3, D = 16, n_rot = 12, pos0 = 4000;
  const float base = 100000.f;
  for (int neox : {0, 1}) {
    for (float fs : {1.0f, 0.25f}) {
      SCOPED_TRACE(testing::Message() << "neox " << neox << " freq_scale " << fs);
      const auto x = random_floats(size_t(T * H * D), 3);
      DevVec<float> dx(x);
      ASSERT_EQ(kvscope::cuda::rope(dx.p, T, H, D, {n_rot, neox, base, fs}, pos0, nullptr),
                cudaSuccess);
      std::vector<float> want = x;
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < n_rot / 2; ++i) {
            const double th = double(pos0 + t) * fs * std::pow(double(base), -2.0 * i / n_rot);
            float* row = &want[size_t((t * H + h) * D)];
            float* a = row + (neox ? i : 2 * i);
            float* b = row + (neox ? i + n_rot / 2 : 2 * i + 1);
            const double x0 = *a, x1 = *b;
            *a = float(x0 * std::cos(th) - x1 * std::sin(th));
            *b = float(x0 * std::sin(th) + x1 * std::cos(th));
          }
      // Dims past n_rot are untouched (compared exactly through the same tolerance).
      EXPECT_TRUE(all_close(dx.get(), want, 2e-6f, 2e-6f));
    }
  }
}

TEST_F(KernelOps, GatedActivationsAddAndBias) {
  const int64_t n = 1000;
  const auto g = random_floats(n, 4, -6.f, 6.f), u = random_floats(n, 5);
  for (auto act : {kvscope::cuda::GateAct::Silu, kvscope::cuda::GateAct::GeluTanh}) {
    DevVec<float> dg(g), du(u);
    ASSERT_EQ(kvscope::cuda::glu(dg.p, du.p, n, act, dg.p, nullptr), cudaSuccess);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      const double a = act == kvscope::cuda::GateAct::Silu
                           ? x / (1.0 + std::exp(-x))
                           : 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      want[i] = float(a * u[i]);
    }
    EXPECT_TRUE(all_close(dg.get(), want, 1e-6f, 1e-6f)) << int(act);
  }
  // add: exact.
  DevVec<float> dx(u), dy(g);
  ASSERT_EQ(kvscope::cuda::add(dx.p, dy.p, n, nullptr), cudaSuccess);
  std::vector<float> exact(n);
  for (int64_t i = 0; i < n; ++i) exact[i] = u[i] + g[i];
  EXPECT_TRUE(all_close(dx.get(), exact, 0.f, 0.f));
  // add_bias over 4 rows of 250: exact.
  const auto b = random_floats(250, 6);
  DevVec<float> dz(u), db(b);
  ASSERT_EQ(kvscope::cuda::add_bias(dz.p, db.p, 4, 250, nullptr), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) exact[i] = u[i] + b[size_t(i % 250)];
  EXPECT_TRUE(all_close(dz.get(), exact, 0.f, 0.f));
}

// A small cache with Hkv = 2, D = 40 (not a multiple of 32) and rows filled by kv_write
// in two appends (positions [0, n-3) then [n-3, n)). With window > 0 the layer is a ring
// of `cap` slots whose queries see the last `window` positions.
struct CacheFixture {
  int Hkv = 2, D = 40, cap = 50, window = 0;
  bool f16;
  std::vector<float> K, V;  // [Hkv][cap][D] as stored (after fp16 rounding)
  std::vector<int32_t> P;   // [cap] position held by each slot
  DevVec<uint8_t> k, v;
  DevVec<int32_t> pos;
  CacheFixture(bool is_f16, int n_keys, int slots = 50, int win = 0)
      : cap(slots),
        window(win),
        f16(is_f16),
        K(size_t(Hkv * cap * D)),
        V(size_t(Hkv * cap * D)),
        P(size_t(cap), -1),
        k(size_t(Hkv * cap * D) * (is_f16 ? 2 : 4)),
        v(size_t(Hkv * cap * D) * (is_f16 ? 2 : 4)),
        pos(std::vector<int32_t>(size_t(cap), -1)) {
    const auto kin = random_floats(size_t(n_keys * Hkv * D), 6, -2.f, 2.f);
    const auto vin = random_floats(size_t(n_keys * Hkv * D), 7);
    DevVec<float> dk(kin), dv(vin);
    EXPECT_EQ(kvscope::cuda::kv_write(layer(), dk.p, dv.p, n_keys - 3, 0, nullptr), cudaSuccess);
    const size_t off = size_t((n_keys - 3) * Hkv * D);
    EXPECT_EQ(kvscope::cuda::kv_write(layer(), dk.p + off, dv.p + off, 3, n_keys - 3, nullptr),
              cudaSuccess);
    for (int p = 0; p < n_keys; ++p) {
      const int slot = p % cap;
      P[size_t(slot)] = p;
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t src = size_t((p * Hkv + h) * D + d), dst = size_t((h * cap + slot) * D + d);
          K[dst] = round(kin[src]);
          V[dst] = round(vin[src]);
        }
    }
  }
  float round(float f) const { return f16 ? kvscope::fp16_to_fp32(kvscope::fp32_to_fp16(f)) : f; }
  kvscope::cuda::KvLayer layer() {
    return kvscope::test::kv_layer(k.p, v.p, f16, Hkv, D, cap, pos.p, window);
  }
  std::vector<float> stored(const DevVec<uint8_t>& side) const {
    return read_cache(side, f16, K.size());
  }
};

TEST_F(KernelOps, KvAppendStoresRowsAndNormsMatch) {
  for (bool f16 : {true, false}) {
    const int n = 11;
    CacheFixture c(f16, n);
    const auto k = c.stored(c.k), v = c.stored(c.v);
    for (int h = 0; h < c.Hkv; ++h)
      for (int p = 0; p < n; ++p)
        for (int d = 0; d < c.D; ++d) {
          const size_t i = size_t((h * c.cap + p) * c.D + d);
          ASSERT_EQ(k[i], c.K[i]) << f16 << " h" << h << " p" << p << " d" << d;
          ASSERT_EQ(v[i], c.V[i]);
        }
    // Rows past the written positions keep the 0xFF fill (NaN): nothing wrote past n.
    EXPECT_TRUE(std::isnan(k[size_t(n * c.D)]));
    // The slot map records exactly the written positions.
    EXPECT_EQ(c.pos.get(), c.P);
    DevVec<float> kn(4), vn(4);
    ASSERT_EQ(kvscope::cuda::kv_row_norms(c.layer(), 5, nullptr, 4, kn.p, vn.p, nullptr), cudaSuccess);
    std::vector<float> wk(4), wv(4);
    for (int t = 0; t < 4; ++t) {
      double sk = 0, sv = 0;
      for (int h = 0; h < c.Hkv; ++h)
        for (int d = 0; d < c.D; ++d) {
          const size_t i = size_t((h * c.cap + 5 + t) * c.D + d);
          sk += double(c.K[i]) * c.K[i];
          sv += double(c.V[i]) * c.V[i];
        }
      wk[t] = float(std::sqrt(sk));
      wv[t] = float(std::sqrt(sv));
    }
    EXPECT_TRUE(all_close(kn.get(), wk, 1e-6f, 2e-6f));
    EXPECT_TRUE(all_close(vn.get(), wv, 1e-6f, 2e-6f));
  }
}

// Reference attention in double over the fixture's slots: query t at pos0 + t sees the
// held positions k <= q with q - k < window (window 0: all).
// split: the decode form (T = 1) that splits the slots over blocks (attention_decode).
void check_attention(CacheFixture& c, int T, int pos0, int H, float scale, bool split = false) {
  const int n_keys = pos0 + T, D = c.D, group = H / c.Hkv;
  const auto q = random_floats(size_t(T * H * D), 8, -1.5f, 1.5f);
  DevVec<float> dq(q), out(size_t(T * H * D));
  const int64_t stride = n_keys + 5;
  DevVec<float> probs(size_t(H * stride));
  if (split) {
    ASSERT_EQ(T, 1);
    DevVec<float> work(size_t(kvscope::cuda::attention_decode_work_floats(H, c.layer())));
    DevVec<unsigned> counters(std::vector<unsigned>(size_t(H), 0u));
    ASSERT_EQ(kvscope::cuda::attention_decode(dq.p, c.layer(), pos0, nullptr, H, scale, out.p,
                                             probs.p, stride, 0, work.p, counters.p, nullptr),
              cudaSuccess)
        << kvscope::cuda::error_detail();
    // The merging blocks put every head's counter back for the next launch.
    EXPECT_EQ(counters.get(), std::vector<unsigned>(size_t(H), 0u));
  } else {
    ASSERT_EQ(kvscope::cuda::attention(dq.p, c.layer(), T, pos0, H, scale, out.p, probs.p, stride,
                                      nullptr),
              cudaSuccess)
        << kvscope::cuda::error_detail();
  }
  std::vector<float> want(out.n), want_p(probs.n);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const int hk = h / group, qp = pos0 + t;
      std::vector<int> seen;  // slots
      for (int s = 0; s < c.cap; ++s) {
        const int kp = c.P[size_t(s)];
        if (kp >= 0 && kp <= qp && (c.window == 0 || qp - kp < c.window)) seen.push_back(s);
      }
      std::vector<double> sc(seen.size());
      double mx = -1e300;
      for (size_t j = 0; j < seen.size(); ++j) {
        double acc = 0;
        for (int d = 0; d < D; ++d)
          acc += double(q[size_t((t * H + h) * D + d)]) * c.K[size_t((hk * c.cap + seen[j]) * D + d)];
        sc[j] = acc * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (double& e : sc) sum += (e = std::exp(e - mx));
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (size_t j = 0; j < seen.size(); ++j)
          acc += sc[j] / sum * c.V[size_t((hk * c.cap + seen[j]) * D + d)];
        want[size_t((t * H + h) * D + d)] = float(acc);
      }
      if (t == T - 1)
        for (size_t j = 0; j < seen.size(); ++j)
          want_p[size_t(h * stride + c.P[size_t(seen[j])])] = float(sc[j] / sum);
    }
  EXPECT_TRUE(all_close(out.get(), want, 1e-5f, 1e-5f));
  // Entries [0, n_keys) of each probability row are written (0 where unseen), the rest not.
  std::vector<float> got_p = probs.get();
  for (int h = 0; h < H; ++h)
    for (int64_t j = n_keys; j < stride; ++j) {
      EXPECT_TRUE(std::isnan(got_p[size_t(h * stride + j)]));
      got_p[size_t(h * stride + j)] = 0;
    }
  EXPECT_TRUE(all_close(got_p, want_p, 2e-6f, 1e-5f));
}

TEST_F(KernelOps, AttentionCausalGqaWithProbabilityRow) {
  for (bool f16 : {true, false}) {
    for (int T : {1, 3}) {
      SCOPED_TRACE(testing::Message() << "f16 " << f16 << " T " << T);
      const int pos0 = 37;
      CacheFixture c(f16, pos0 + T);
      check_attention(c, T, pos0, 6, 1.0f / std::sqrt(float(c.D)));
      if (T == 1) check_attention(c, T, pos0, 6, 1.0f / std::sqrt(float(c.D)), /*split=*/true);
    }
  }
}

// The split decode form over several chunks of 32 slots, with a window that leaves the
// first chunks with no visible key at all (their partial max is -inf and must drop out of
// the merge), and over a wrapped ring.
TEST_F(KernelOps, SplitDecodeAttentionOverManyChunks) {
  for (bool f16 : {true, false}) {
    SCOPED_TRACE(testing::Message() << "f16 " << f16);
    const int n = 300;
    CacheFixture full(f16, n);
    check_attention(full, 1, n - 1, 6, 0.2f, /*split=*/true);
    CacheFixture windowed(f16, n, /*slots=*/n, /*win=*/70);
    check_attention(windowed, 1, n - 1, 6, 0.2f, /*split=*/true);
    CacheFixture ring(f16, n, /*slots=*/150, /*win=*/140);
    check_attention(ring, 1, n - 1, 4, 0.3f, /*split=*/true);
  }
}

// A ring of 16 slots after 45 positions, window 13: each query sees only the last 13
// positions, its probability row is 0 before them, and the slots hold positions 29..44
// out of order.
TEST_F(KernelOps, AttentionOverARingWithAWindow) {
  for (int T : {1, 3}) {
    SCOPED_TRACE(testing::Message() << "T " << T);
    const int n = 45, pos0 = n - T;
    CacheFixture c(true, n, /*slots=*/16, /*win=*/13);
    EXPECT_EQ(c.pos.get(), c.P);
    check_attention(c, T, pos0, 4, 0.3f);
    if (T == 1) check_attention(c, T, pos0, 4, 0.3f, /*split=*/true);
  }
}

}  // namespace
