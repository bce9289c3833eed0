// test_kernel_fused.cpp — the fused decode kernels (matmul_qkv, matmul_glu,
// rope_kv_write with adjacent and NeoX pairs, add_rmsnorm; norm_ffn against the unfused
// kernels only, on one and on four emulator workers) under the CUDA emulator, each against
// two references:
//  1. the unfused kernels they replace, run on the same inputs: every fused kernel uses
//     the same per-element arithmetic in the same order (shared device helpers, same
//     block sizes for reductions). RoPE and the cache store are bit-exact (explicit
//     fmaf, kernels/rope_kv.cuh); the matvecs and the norm are compared with kUlp
//     relative slack, because the compiler may contract a*b+c into an FMA differently
//     in two inlined copies of the same helper (-march=native, nvcc);
//  2. a CPU reference in double, with tolerances:
//     - matvecs: fp32 accumulation in another order, 1e-5 of the row's sum of |w x|
//       (as test_kernel_quant);
//     - act(g)·u (SiLU, tanh-GELU): the gate and up errors above propagated through the
//       product (|d act/dg| <= 1.13), plus 1e-6 absolute;
//     - rope: 2e-6 (angle in double on both sides, fp32 rotate); fp16 cache rows are the
//       round-to-nearest of the rotated value, compared after the same rounding with
//       one fp16 ulp of slack (2^-10 relative) for values near a rounding tie;
//     - add_rmsnorm: the add is exact; the norm 2e-6 relative (fp32 tree sum vs double).
// Sizes are deliberately not multiples of the warp (32), the 8 rows per block, or the
// 4-rows-at-a-time chunk of the matvecs.
#include <cstring>

#include "engine/quant.h"
#include "kernels/emu/emu.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/quant_test_util.h"

namespace {

using kvscope::GgmlType;
using kvscope::cuda::QMatrix;
using kvscope::test::all_close;
using kvscope::test::DevVec;
using kvscope::test::HostMatrix;
using kvscope::test::qmatrix;
using kvscope::test::random_floats;
using kvscope::test::random_matrix;

constexpr float kUlp = 2.5e-7f;  // about two fp32 ulps, relative

class KernelFused : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

// Double-precision W·x for T rows plus the per-output bound sum |w x|.
void ref_matmul(const HostMatrix& m, const std::vector<float>& x, int T, std::vector<double>* out,
                std::vector<double>* bound) {
  const std::vector<float> W = m.dequant();
  out->assign(size_t(T * m.n_out), 0.0);
  bound->assign(out->size(), 0.0);
  for (int t = 0; t < T; ++t)
    for (int64_t o = 0; o < m.n_out; ++o) {
      double acc = 0, mag = 0;
      for (int64_t i = 0; i < m.n_in; ++i) {
        const double p = double(W[size_t(o * m.n_in + i)]) * x[size_t(t * m.n_in + i)];
        acc += p;
        mag += std::fabs(p);
      }
      (*out)[size_t(t * m.n_out + o)] = acc;
      (*bound)[size_t(t * m.n_out + o)] = mag;
    }
}

TEST_F(KernelFused, MatvecQkvEqualsThreeMatvecs) {
  struct Types { GgmlType q, k, v; };
  for (Types ty : {Types{GgmlType::Q4_1, GgmlType::Q4_1, GgmlType::Q4_1},
                   Types{GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q8_0}}) {
    for (int64_t n_in : {96, 608}) {   // 3 blocks (fewer units than lanes), 19 blocks
      for (int T : {1, 5}) {           // 5 crosses the 4-rows-at-a-time chunk
        SCOPED_TRACE(::testing::Message() << kvscope::ggml_type_name(ty.q) << " n_in " << n_in
                                          << " T " << T);
        // 37 + 13 + 11 = 61 rows: the last block of 8 warps is partly empty, and the
        // matrix boundaries fall inside blocks.
        HostMatrix wq = random_matrix(ty.q, n_in, 37, 21), wk = random_matrix(ty.k, n_in, 13, 22),
                   wv = random_matrix(ty.v, n_in, 11, 23);
        const auto x = random_floats(size_t(T * n_in), 24);
        DevVec<uint8_t> dq(wq.bytes), dk(wk.bytes), dv(wv.bytes);
        DevVec<float> dx(x), q(size_t(T * 37)), k(size_t(T * 13)), v(size_t(T * 11));
        DevVec<float> q1(q.n), k1(k.n), v1(v.n);
        ASSERT_EQ(kvscope::cuda::matmul_qkv(qmatrix(wq, dq.p), qmatrix(wk, dk.p), qmatrix(wv, dv.p),
                                           dx.p, T, q.p, k.p, v.p, nullptr),
                  cudaSuccess)
            << kvscope::cuda::error_detail();
        ASSERT_EQ(kvscope::cuda::matmul(qmatrix(wq, dq.p), dx.p, T, q1.p, nullptr), cudaSuccess);
        ASSERT_EQ(kvscope::cuda::matmul(qmatrix(wk, dk.p), dx.p, T, k1.p, nullptr), cudaSuccess);
        ASSERT_EQ(kvscope::cuda::matmul(qmatrix(wv, dv.p), dx.p, T, v1.p, nullptr), cudaSuccess);
        EXPECT_TRUE(all_close(q.get(), q1.get(), 0.f, kUlp));
        EXPECT_TRUE(all_close(k.get(), k1.get(), 0.f, kUlp));
        EXPECT_TRUE(all_close(v.get(), v1.get(), 0.f, kUlp));
        const HostMatrix* ms[3] = {&wq, &wk, &wv};
        const DevVec<float>* outs[3] = {&q, &k, &v};
        for (int m = 0; m < 3; ++m) {
          std::vector<double> want, bound;
          ref_matmul(*ms[m], x, T, &want, &bound);
          const auto got = outs[m]->get();
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(got[i], want[i], 1e-5 * bound[i] + 1e-6) << "matrix " << m << " i " << i;
        }
      }
    }
  }
}

// The activation in double: silu or tanh-GELU.
double ref_act(kvscope::cuda::GateAct act, double g) {
  if (act == kvscope::cuda::GateAct::Silu) return g / (1.0 + std::exp(-g));
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

TEST_F(KernelFused, GateUpGluEqualsMatvecsThenGlu) {
  for (auto act : {kvscope::cuda::GateAct::Silu, kvscope::cuda::GateAct::GeluTanh})
  for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0}) {
    for (int64_t n_in : {96, 608}) {
      for (int T : {1, 5}) {
        SCOPED_TRACE(::testing::Message() << kvscope::ggml_type_name(type) << " n_in " << n_in
                                          << " T " << T << " act " << int(act));
        const int64_t F = 45;
        HostMatrix wg = random_matrix(type, n_in, F, 31), wu = random_matrix(type, n_in, F, 32);
        // Activations large enough that gate values reach the nonlinear part of silu.
        const auto x = random_floats(size_t(T * n_in), 33, -3.f, 3.f);
        DevVec<uint8_t> dg(wg.bytes), du(wu.bytes);
        DevVec<float> dx(x), out(size_t(T * F)), g(out.n), u(out.n);
        ASSERT_EQ(kvscope::cuda::matmul_glu(qmatrix(wg, dg.p), qmatrix(wu, du.p), dx.p, T,
                                                   act, out.p, nullptr),
                  cudaSuccess)
            << kvscope::cuda::error_detail();
        ASSERT_EQ(kvscope::cuda::matmul(qmatrix(wg, dg.p), dx.p, T, g.p, nullptr), cudaSuccess);
        ASSERT_EQ(kvscope::cuda::matmul(qmatrix(wu, du.p), dx.p, T, u.p, nullptr), cudaSuccess);
        ASSERT_EQ(kvscope::cuda::glu(g.p, u.p, int64_t(g.n), act, g.p, nullptr), cudaSuccess);
        const auto got = out.get();
        EXPECT_TRUE(all_close(got, g.get(), 0.f, kUlp));
        std::vector<double> gw, gb, uw, ub;
        ref_matmul(wg, x, T, &gw, &gb);
        ref_matmul(wu, x, T, &uw, &ub);
        for (size_t i = 0; i < got.size(); ++i) {
          const double a = ref_act(act, gw[i]);
          const double want = a * uw[i];
          // Both activations have slope at most ~1.13: the gate's error passes through.
          const double tol = 1e-5 * (1.2 * gb[i] * std::fabs(uw[i]) + ub[i] * std::fabs(a)) + 1e-6;
          ASSERT_NEAR(got[i], want, tol) << "i " << i;
        }
      }
    }
  }
}

float to_f16_and_back(float f) { return kvscope::fp16_to_fp32(kvscope::fp32_to_fp16(f)); }

TEST_F(KernelFused, RopeKvWriteEqualsRopeRopeAppend) {
  struct Shape { int H, Hkv, D, n_rot; };
  for (int neox : {0, 1})
  // Full rotation with D = 40; partial rotation; odd D with its short last pair.
  for (Shape sh : {Shape{6, 2, 40, 40}, Shape{4, 4, 24, 16}, Shape{3, 1, 13, 10}}) {
    for (bool f16 : {true, false}) {
      for (int T : {1, 3}) {
        for (bool from_device : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "D " << sh.D << " n_rot " << sh.n_rot << " f16 "
                                            << f16 << " T " << T << " dev " << from_device
                                            << " neox " << neox);
          const int pos0 = 3001, cap = 3010, H = sh.H, Hkv = sh.Hkv, D = sh.D;
          const float base = 100000.f;
          const kvscope::cuda::RopeArgs ra{sh.n_rot, neox, base, 1.0f};
          const int half = sh.n_rot / 2;
          const size_t kv_vals = size_t(Hkv) * cap * D, eb = f16 ? 2 : 4;
          const auto q = random_floats(size_t(T * H * D), 41, -2.f, 2.f);
          const auto k = random_floats(size_t(T * Hkv * D), 42, -2.f, 2.f);
          const auto v = random_floats(size_t(T * Hkv * D), 43);
          // Fused.
          DevVec<float> fq(q), fk(k), fv(v);
          DevVec<uint8_t> fkc(kv_vals * eb), fvc(kv_vals * eb);
          DevVec<int> pos_dev(std::vector<int>{pos0});
          DevVec<int32_t> fpos(std::vector<int32_t>(size_t(cap), -1));
          const auto fl = kvscope::test::kv_layer(fkc.p, fvc.p, f16, Hkv, D, cap, fpos.p);
          ASSERT_EQ(kvscope::cuda::rope_kv_write(fq.p, fk.p, fv.p, T, H, ra, fl,
                                                from_device ? -12345 : pos0,
                                                from_device ? pos_dev.p : nullptr, nullptr),
                    cudaSuccess)
              << kvscope::cuda::error_detail();
          // Unfused.
          DevVec<float> uq(q), uk(k), uv(v);
          DevVec<uint8_t> ukc(kv_vals * eb), uvc(kv_vals * eb);
          DevVec<int32_t> upos(std::vector<int32_t>(size_t(cap), -1));
          const auto ul = kvscope::test::kv_layer(ukc.p, uvc.p, f16, Hkv, D, cap, upos.p);
          ASSERT_EQ(kvscope::cuda::rope(uq.p, T, H, D, ra, pos0, nullptr), cudaSuccess);
          ASSERT_EQ(kvscope::cuda::rope(uk.p, T, Hkv, D, ra, pos0, nullptr), cudaSuccess);
          ASSERT_EQ(kvscope::cuda::kv_write(ul, uk.p, uv.p, T, pos0, nullptr), cudaSuccess);
          const auto gq = fq.get(), gk = fk.get();
          EXPECT_TRUE(all_close(gq, uq.get(), 0.f, 0.f));
          EXPECT_TRUE(all_close(gk, uk.get(), 0.f, 0.f));
          EXPECT_EQ(fkc.get(), ukc.get()) << "K cache bytes differ";  // untouched rows: 0xFF both
          EXPECT_EQ(fvc.get(), uvc.get()) << "V cache bytes differ";
          const auto fmap = fpos.get();
          EXPECT_EQ(fmap, upos.get()) << "slot maps differ";
          for (int t = 0; t < T; ++t) EXPECT_EQ(fmap[size_t(pos0 + t)], pos0 + t);
          // Against the double reference.
          auto rotate = [&](std::vector<float> x, int heads) {
            for (int t = 0; t < T; ++t)
              for (int h = 0; h < heads; ++h)
                for (int i = 0; i < sh.n_rot / 2; ++i) {
                  const double th = double(pos0 + t) * std::pow(double(base), -2.0 * i / sh.n_rot);
                  float* row = &x[size_t((t * heads + h) * D)];
                  float* a = row + (neox ? i : 2 * i);
                  float* b = row + (neox ? i + half : 2 * i + 1);
                  const double x0 = *a, x1 = *b;
                  *a = float(x0 * std::cos(th) - x1 * std::sin(th));
                  *b = float(x0 * std::sin(th) + x1 * std::cos(th));
                }
            return x;
          };
          const auto wq = rotate(q, H), wk = rotate(k, Hkv);
          EXPECT_TRUE(all_close(gq, wq, 2e-6f, 2e-6f));
          EXPECT_TRUE(all_close(gk, wk, 2e-6f, 2e-6f));
          const auto kc = read_cache(fkc, f16, kv_vals), vc = read_cache(fvc, f16, kv_vals);
          for (int t = 0; t < T; ++t)
            for (int h = 0; h < Hkv; ++h)
              for (int d = 0; d < D; ++d) {
                const size_t src = size_t((t * Hkv + h) * D + d);
                const size_t dst = (size_t(h) * cap + size_t(pos0 + t)) * D + size_t(d);
                const float want_k = f16 ? to_f16_and_back(wk[src]) : wk[src];
                const float want_v = f16 ? to_f16_and_back(v[src]) : v[src];
                ASSERT_NEAR(kc[dst], want_k, 2e-6f + (f16 ? std::fabs(want_k) / 1024 : 2e-6f))
                    << "h " << h << " t " << t << " d " << d;
                ASSERT_EQ(vc[dst], want_v) << "h " << h << " t " << t << " d " << d;
              }
          // Nothing was written before pos0 (the 0xFF fill reads as NaN).
          EXPECT_TRUE(std::isnan(kc[size_t(pos0 - 1) * D]));
          EXPECT_TRUE(std::isnan(vc[size_t(pos0 - 1) * D]));
        }
      }
    }
  }
}

TEST_F(KernelFused, AddRmsnormEqualsAddThenRmsnorm) {
  for (int C : {7, 100, 1500}) {
    SCOPED_TRACE(C);
    const int T = 3;
    const auto x = random_floats(size_t(T * C), 51, -2.f, 2.f);
    const auto y = random_floats(size_t(T * C), 52);
    const auto w = random_floats(size_t(C), 53, 0.5f, 1.5f);
    DevVec<float> fx(x), fy(y), dw(w), fout(x.size());
    ASSERT_EQ(kvscope::cuda::add_rmsnorm(fx.p, fy.p, dw.p, T, C, 1e-5f, fout.p, nullptr), cudaSuccess)
        << kvscope::cuda::error_detail();
    DevVec<float> ux(x), uy(y), uout(x.size());
    ASSERT_EQ(kvscope::cuda::add(ux.p, uy.p, int64_t(x.size()), nullptr), cudaSuccess);
    ASSERT_EQ(kvscope::cuda::rmsnorm(ux.p, dw.p, T, C, 1e-5f, uout.p, nullptr), cudaSuccess);
    const auto gx = fx.get(), gout = fout.get();
    EXPECT_TRUE(all_close(gx, ux.get(), 0.f, 0.f));
    EXPECT_TRUE(all_close(gout, uout.get(), 0.f, kUlp));
    std::vector<float> want_x(x.size()), want(x.size());
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < C; ++i) {
        const size_t j = size_t(t * C + i);
        want_x[j] = x[j] + y[j];
        ss += double(want_x[j]) * want_x[j];
      }
      const double s = 1.0 / std::sqrt(ss / C + 1e-5);
      for (int i = 0; i < C; ++i) want[size_t(t * C + i)] = float(want_x[size_t(t * C + i)] * s * w[size_t(i)]);
    }
    EXPECT_TRUE(all_close(gx, want_x, 0.f, 0.f));  // fp32 add, exactly
    EXPECT_TRUE(all_close(gout, want, 1e-7f, 2e-6f));
  }
}

// norm_ffn (one launch: residual step, gate/up + activation, down split over F, the last
// block summing the slices) against add_rmsnorm + matmul_glu + matmul on the same inputs,
// with blocks on one worker and on four (blocks finish in another order, another block
// does the epilogue): results are bit-identical between the two (the slices are summed in
// slice order whoever sums them), the counter is back to zero after each launch, x is the
// exact sum and h the norm up to two ulps (another reduction width); out is the product
// up to 1e-5 of the largest |out| (the down product summed over 32-wide slices first).
TEST_F(KernelFused, NormFfnEqualsAddRmsnormGluThenDown) {
  using kvscope::cuda::GateAct;
  for (GateAct act : {GateAct::Silu, GateAct::GeluTanh})
    for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0}) {
      SCOPED_TRACE(::testing::Message() << kvscope::ggml_type_name(type) << " act " << int(act));
      const int64_t C = 96, F = 160;
      HostMatrix wg = random_matrix(type, C, F, 41), wu = random_matrix(type, C, F, 42),
                 wd = random_matrix(type, F, C, 43);
      const auto x = random_floats(size_t(C), 44, -3.f, 3.f);
      const auto y = random_floats(size_t(C), 45, -1.f, 1.f);
      const auto w = random_floats(size_t(C), 46, 0.5f, 1.5f);
      DevVec<uint8_t> dg(wg.bytes), du(wu.bytes), dd(wd.bytes);
      DevVec<float> dw(w), dy(y);
      // The unfused kernels.
      DevVec<float> rx(x), rh{size_t(C)}, rg{size_t(F)}, rout{size_t(C)};
      ASSERT_EQ(kvscope::cuda::add_rmsnorm(rx.p, dy.p, dw.p, 1, int(C), 1e-6f, rh.p, nullptr),
                cudaSuccess);
      ASSERT_EQ(kvscope::cuda::matmul_glu(qmatrix(wg, dg.p), qmatrix(wu, du.p), rh.p, 1, act,
                                          rg.p, nullptr),
                cudaSuccess);
      ASSERT_EQ(kvscope::cuda::matmul(qmatrix(wd, dd.p), rg.p, 1, rout.p, nullptr), cudaSuccess);
      const auto want = rout.get();
      float max_want = 0;
      for (float v : want) max_want = std::max(max_want, std::fabs(v));
      std::vector<std::vector<float>> outs;
      const int before = kvscope::emu::workers();
      for (int workers : {1, 4}) {
        kvscope::emu::set_workers(workers);
        DevVec<float> fx(x), fh{size_t(C)}, out{size_t(C)},
            work{size_t(kvscope::cuda::norm_ffn_work_floats(F, C))};
        DevVec<unsigned> counter(std::vector<unsigned>{0u});
        kvscope::cuda::ResidualArgs r;
        r.x = fx.p;
        r.y = dy.p;
        r.w = dw.p;
        r.h = fh.p;
        r.C = int(C);
        r.eps = 1e-6f;
        for (int rep = 0; rep < 3; ++rep) {
          ASSERT_EQ(cudaMemcpy(fx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(kvscope::cuda::norm_ffn(r, qmatrix(wg, dg.p), qmatrix(wu, du.p),
                                            qmatrix(wd, dd.p), act, work.p, out.p, counter.p,
                                            nullptr),
                    cudaSuccess)
              << kvscope::cuda::error_detail();
          EXPECT_EQ(counter.get(), std::vector<unsigned>{0u}) << "workers " << workers;
          outs.push_back(out.get());
        }
        EXPECT_EQ(fx.get(), rx.get()) << "workers " << workers;
        EXPECT_TRUE(all_close(fh.get(), rh.get(), 0.f, kUlp)) << "workers " << workers;
        EXPECT_TRUE(all_close(outs.back(), want, 1e-5f * max_want, 0.f)) << "workers " << workers;
      }
      kvscope::emu::set_workers(before);
      for (size_t i = 1; i < outs.size(); ++i) EXPECT_EQ(outs[i], outs[0]) << "run " << i;
    }
}

TEST_F(KernelFused, FusedMatvecsRejectWhatTheyCannotRun) {
  DevVec<uint8_t> w(4096);
  DevVec<float> x(512), out(64);
  const QMatrix ok{w.p, kvscope::cuda::QType::Q8_0, 64, 2, 68};
  const QMatrix k_quant{w.p, kvscope::cuda::QType::Q4_K, 256, 2, 144};
  const QMatrix other_width{w.p, kvscope::cuda::QType::Q8_0, 96, 2, 102};
  EXPECT_EQ(kvscope::cuda::matmul_qkv(ok, k_quant, ok, x.p, 1, out.p, out.p, out.p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kvscope::cuda::matmul_qkv(ok, ok, other_width, x.p, 1, out.p, out.p, out.p, nullptr),
            cudaErrorInvalidValue);
  const auto silu = kvscope::cuda::GateAct::Silu;
  EXPECT_EQ(kvscope::cuda::matmul_glu(ok, other_width, x.p, 1, silu, out.p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kvscope::cuda::matmul_glu(k_quant, k_quant, x.p, 1, silu, out.p, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
