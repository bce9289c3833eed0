// test_kernel_kv_quant.cpp — the KV cache kernels over q8_0 / q4_0 rows (kernels/
// kv_quant.cuh) under the CUDA emulator, and as test_kernel_kv_quant_gpu against the real
// kernels where a GPU is usable, against the CPU backend's row store and load
// (engine/cpu/cpu_kv_cache.h):
//  - kv_write and rope_kv_write store the very bytes the CPU stores for the same fp32
//    rows (bit for bit: same fp32 scale, IEEE division, one fma for q4_0), including a
//    hand-built q4_0 block, an all-zero block, magnitude ties and a negative extreme;
//  - attention (prefill and split decode) over a quantized cache equals attention over an
//    f32 cache holding the dequantized rows: the dequantized values are exact in fp32 and
//    the summation order is the same, so only FMA contraction of the two template
//    instances may differ (1e-6 absolute on outputs and probabilities of magnitude ~1);
//  - kv_row_norms of quantized rows equal the norms of the dequantized rows (fp32 sums: 1e-5
//    relative);
//  - kv_rerotate of quantized K rows equals the CPU's dequantize, rotate, quantize: the
//    rotations differ by fp32 rounding (explicit fmas here, compiler-chosen on the CPU),
//    which can move a value across a rounding boundary, so values agree within one step of
//    their block (d) and at least 99% of the quant bytes are identical; rows below `first`
//    and empty slots are untouched.
#include <cstring>

#include "engine/cpu/cpu_kv_cache.h"
#include "engine/cpu/elementwise.h"
#include "engine/quant.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/util/skip_reason.h"

namespace kvscope::test {
namespace {

using kvscope::KvDtype;
using kvscope::cuda::KvElem;

class KernelKvQuant : public ::testing::Test {
 protected:
#if defined(KVSCOPE_REAL_GPU_TEST)
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
      GTEST_SKIP() << kSkipNoGpu << "no GPU for the real-kernel test";
  }
#endif
  void TearDown() override { cudaDeviceReset(); }
};

size_t row_bytes(KvDtype t, int D) {
  return size_t(kvscope::kv_row_bytes(t, D));
}

// Values that exercise the block rules: random rows, then in row 1 an all-zero block, a
// block whose extreme is negative and tied in magnitude with a positive value, and a block
// of values on q8_0 / q4_0 rounding midpoints.
std::vector<float> test_rows(int rows, int D, uint32_t seed) {
  auto x = random_floats(size_t(rows) * D, seed, -3.f, 3.f);
  if (rows > 1 && D >= 96) {
    float* r = x.data() + D;
    for (int i = 0; i < 32; ++i) r[i] = 0.0f;
    for (int i = 32; i < 64; ++i) r[i] *= 0.25f;  // |x| <= 0.75 but for the tie below
    r[32 + 3] = 2.5f;
    r[32 + 7] = -2.5f;  // tie in magnitude: the first (positive) one is the extreme
    r[32 + 9] = -2.5f;
    for (int i = 0; i < 32; ++i) r[64 + i] = float(i - 16) * 0.25f;  // q4_0 midpoints
  }
  return x;
}

// Host bytes of rows [rows][D] in type t, through the CPU backend's store.
std::vector<uint8_t> cpu_store(KvDtype t, const std::vector<float>& x, int rows, int D) {
  std::vector<uint8_t> out(size_t(rows) * row_bytes(t, D));
  for (int r = 0; r < rows; ++r)
    kvscope::cpu::store_row(t, x.data() + size_t(r) * D, out.data() + r * row_bytes(t, D), D);
  return out;
}

std::vector<float> cpu_load(KvDtype t, const std::vector<uint8_t>& b, int rows, int D) {
  std::vector<float> out(size_t(rows) * D);
  for (int r = 0; r < rows; ++r)
    kvscope::cpu::load_row(t, b.data() + r * row_bytes(t, D), out.data() + size_t(r) * D, D);
  return out;
}

kvscope::cuda::KvLayer layer(void* k, void* v, KvDtype kt, KvDtype vt, int Hkv, int D, int n,
                            int32_t* pos) {
  kvscope::cuda::KvLayer l = kv_layer(k, v, false, Hkv, D, n, pos);
  l.k_type = KvElem(int(kt));
  l.v_type = KvElem(int(vt));
  return l;
}

// Cache rows [Hkv][n] from input rows [n][Hkv][D] (slot = position).
std::vector<float> to_cache_order(const std::vector<float>& x, int n, int Hkv, int D) {
  std::vector<float> out(x.size());
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < Hkv; ++h)
      std::memcpy(out.data() + (size_t(h) * n + t) * D, x.data() + (size_t(t) * Hkv + h) * D,
                  size_t(D) * 4);
  return out;
}

TEST_F(KernelKvQuant, HandBuiltQ4_0BlockFromTheKernel) {
  // One row of 32: 1.0 at 0, -2.0 at 5, zeros elsewhere. m = -2, d = 0.25, 1/d = 4:
  // q = trunc(4x + 8.5): 1.0 -> 12, 0 -> 8, -2.0 -> 0; d = +0.25 is fp16 0x3400.
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  x[5] = -2.0f;
  std::vector<uint8_t> want(18, uint8_t(8 | (8 << 4)));
  want[0] = 0x00;
  want[1] = 0x34;
  want[2 + 0] = uint8_t(12 | (8 << 4));
  want[2 + 5] = uint8_t(0 | (8 << 4));
  DevVec<float> dk(x), dv(x);
  DevVec<uint8_t> kc(18), vc(34);
  DevVec<int32_t> pos(std::vector<int32_t>{-1});
  ASSERT_EQ(
      kvscope::cuda::kv_write(layer(kc.p, vc.p, KvDtype::Q4_0, KvDtype::Q8_0, 1, 32, 1, pos.p),
                              dk.p, dv.p, 1, 0, nullptr),
      cudaSuccess);
  EXPECT_EQ(kc.get(), want);
  // q8_0: d = 2/127, q = round(x / d): -2.0 -> -127, 1.0 -> 63.5 give or take the
  // rounding of 1/d, and exactly what the CPU stores.
  const auto v = vc.get();
  EXPECT_EQ(int8_t(v[2 + 5]), -127);
  EXPECT_TRUE(int8_t(v[2 + 0]) == 63 || int8_t(v[2 + 0]) == 64);
  EXPECT_EQ(v, cpu_store(KvDtype::Q8_0, x, 1, 32));
  EXPECT_EQ(pos.get()[0], 0);
}

TEST_F(KernelKvQuant, AppendAndRopeWriteStoreTheCpuBytes) {
  constexpr int Hkv = 2, D = 96, n = 5, H = 4;
  const KvDtype pairs[][2] = {{KvDtype::Q8_0, KvDtype::Q8_0},
                              {KvDtype::Q4_0, KvDtype::Q4_0},
                              {KvDtype::Q8_0, KvDtype::F16},
                              {KvDtype::F32, KvDtype::Q4_0}};
  const auto k = test_rows(n * Hkv, D, 3), v = test_rows(n * Hkv, D, 4);
  const auto q = random_floats(size_t(n) * H * D, 5);
  for (const auto& tp : pairs) {
    const KvDtype kt = tp[0], vt = tp[1];
    SCOPED_TRACE(std::string(kvscope::kv_dtype_name(kt)) + "/" + kvscope::kv_dtype_name(vt));
    const auto want_k = cpu_store(kt, to_cache_order(k, n, Hkv, D), Hkv * n, D);
    const auto want_v = cpu_store(vt, to_cache_order(v, n, Hkv, D), Hkv * n, D);
    DevVec<float> dk(k), dv(v);
    DevVec<uint8_t> kc(want_k.size()), vc(want_v.size());
    DevVec<int32_t> pos(std::vector<int32_t>(n, -1));
    const auto l = layer(kc.p, vc.p, kt, vt, Hkv, D, n, pos.p);
    // Two appends: positions 0..2, then 3..4.
    ASSERT_EQ(kvscope::cuda::kv_write(l, dk.p, dv.p, 3, 0, nullptr), cudaSuccess);
    ASSERT_EQ(kvscope::cuda::kv_write(l, dk.p + 3 * Hkv * D, dv.p + 3 * Hkv * D, 2, 3, nullptr),
              cudaSuccess);
    EXPECT_EQ(kc.get(), want_k);
    EXPECT_EQ(vc.get(), want_v);
    EXPECT_EQ(pos.get(), (std::vector<int32_t>{0, 1, 2, 3, 4}));

    // rope_kv_write with n_rot = 0 stores the same rows; with rotation it stores what
    // rope() + kv_write() store (checked byte for byte below).
    DevVec<uint8_t> kc2(want_k.size()), vc2(want_v.size());
    DevVec<int32_t> pos2(std::vector<int32_t>(n, -1));
    DevVec<float> dq(q), dk2(k);
    const auto l2 = layer(kc2.p, vc2.p, kt, vt, Hkv, D, n, pos2.p);
    ASSERT_EQ(kvscope::cuda::rope_kv_write(dq.p, dk2.p, dv.p, n, H, {0, 0, 10000.f, 1.f}, l2, 0,
                                          nullptr, nullptr),
              cudaSuccess);
    EXPECT_EQ(kc2.get(), want_k);
    EXPECT_EQ(vc2.get(), want_v);
    const kvscope::cuda::RopeArgs r{64, 1, 10000.f, 1.f};
    DevVec<float> dk3(k), dq3(q);
    ASSERT_EQ(kvscope::cuda::rope_kv_write(dq3.p, dk3.p, dv.p, n, H, r, l2, 0, nullptr, nullptr),
              cudaSuccess);
    DevVec<float> dk4(k);
    ASSERT_EQ(kvscope::cuda::rope(dk4.p, n, Hkv, D, r, 0, nullptr), cudaSuccess);
    ASSERT_EQ(kvscope::cuda::kv_write(l, dk4.p, dv.p, n, 0, nullptr), cudaSuccess);
    EXPECT_EQ(kc2.get(), kc.get());
    EXPECT_EQ(vc2.get(), vc.get());
  }
}

// Attention and norms over a quantized cache vs an f32 cache of the dequantized rows.
TEST_F(KernelKvQuant, AttentionOverQuantizedRowsEqualsAttentionOverTheirValues) {
  constexpr int Hkv = 2, H = 6, D = 64, n = 45;
  const KvDtype pairs[][2] = {{KvDtype::Q8_0, KvDtype::Q8_0},
                              {KvDtype::Q4_0, KvDtype::Q4_0},
                              {KvDtype::Q8_0, KvDtype::F16},
                              {KvDtype::F16, KvDtype::Q4_0}};
  const auto k = random_floats(size_t(n) * Hkv * D, 11, -2.f, 2.f);
  const auto v = random_floats(size_t(n) * Hkv * D, 12);
  for (const auto& tp : pairs) {
    const KvDtype kt = tp[0], vt = tp[1];
    SCOPED_TRACE(std::string(kvscope::kv_dtype_name(kt)) + "/" + kvscope::kv_dtype_name(vt));
    const auto kq = cpu_store(kt, to_cache_order(k, n, Hkv, D), Hkv * n, D);
    const auto vq = cpu_store(vt, to_cache_order(v, n, Hkv, D), Hkv * n, D);
    const auto kf = cpu_load(kt, kq, Hkv * n, D), vf = cpu_load(vt, vq, Hkv * n, D);
    std::vector<int32_t> p(n);
    for (int i = 0; i < n; ++i) p[size_t(i)] = i;
    DevVec<uint8_t> kcq(kq), vcq(vq);
    DevVec<float> kcf(kf), vcf(vf);
    DevVec<int32_t> pos(p);
    const auto lq = layer(kcq.p, vcq.p, kt, vt, Hkv, D, n, pos.p);
    const auto lf = layer(kcf.p, vcf.p, KvDtype::F32, KvDtype::F32, Hkv, D, n, pos.p);
    for (int T : {1, 4}) {
      const int pos0 = n - T;
      const auto q = random_floats(size_t(T) * H * D, 13 + T);
      DevVec<float> dq(q), out_q(size_t(T) * H * D), out_f(size_t(T) * H * D);
      DevVec<float> pr_q(size_t(H) * n), pr_f(size_t(H) * n);
      const float scale = 0.125f;
      ASSERT_EQ(kvscope::cuda::attention(dq.p, lq, T, pos0, H, scale, out_q.p, pr_q.p, n, nullptr),
                cudaSuccess);
      ASSERT_EQ(kvscope::cuda::attention(dq.p, lf, T, pos0, H, scale, out_f.p, pr_f.p, n, nullptr),
                cudaSuccess);
      EXPECT_TRUE(all_close(out_q.get(), out_f.get(), 1e-6f, 0.0f)) << "T " << T;
      EXPECT_TRUE(all_close(pr_q.get(), pr_f.get(), 1e-6f, 0.0f)) << "T " << T;
      if (T != 1) continue;
      DevVec<float> work(size_t(kvscope::cuda::attention_decode_work_floats(H, lq)));
      // The second launch finds the counters the first one left: zero.
      DevVec<unsigned> counters(std::vector<unsigned>(size_t(H), 0u));
      ASSERT_EQ(kvscope::cuda::attention_decode(dq.p, lq, pos0, nullptr, H, scale, out_q.p, pr_q.p,
                                               n, 0, work.p, counters.p, nullptr),
                cudaSuccess);
      ASSERT_EQ(kvscope::cuda::attention_decode(dq.p, lf, pos0, nullptr, H, scale, out_f.p, pr_f.p,
                                               n, 0, work.p, counters.p, nullptr),
                cudaSuccess);
      EXPECT_TRUE(all_close(out_q.get(), out_f.get(), 1e-6f, 0.0f)) << "split decode";
      EXPECT_TRUE(all_close(pr_q.get(), pr_f.get(), 1e-6f, 0.0f)) << "split decode";
    }
    DevVec<float> kn_q(n), vn_q(n), kn_f(n), vn_f(n);
    ASSERT_EQ(kvscope::cuda::kv_row_norms(lq, 0, nullptr, n, kn_q.p, vn_q.p, nullptr), cudaSuccess);
    ASSERT_EQ(kvscope::cuda::kv_row_norms(lf, 0, nullptr, n, kn_f.p, vn_f.p, nullptr), cudaSuccess);
    EXPECT_TRUE(all_close(kn_q.get(), kn_f.get(), 0.0f, 1e-5f));
    EXPECT_TRUE(all_close(vn_q.get(), vn_f.get(), 0.0f, 1e-5f));
  }
}

TEST_F(KernelKvQuant, RerotateRequantizesAsTheCpu) {
  constexpr int Hkv = 2, D = 64, n_rot = 48, n_slots = 10, first = 3, delta = -5;
  const std::vector<int32_t> pos{10, 11, 2, 3, -1, 5, 6, 7, 8, 9};  // a wrapped ring, one empty
  const auto x = random_floats(size_t(Hkv) * n_slots * D, 21, -2.f, 2.f);
  for (KvDtype t : {KvDtype::Q8_0, KvDtype::Q4_0}) {
    for (bool neox : {false, true}) {
      SCOPED_TRACE(std::string(kvscope::kv_dtype_name(t)) + (neox ? " neox" : " adjacent"));
      const size_t rb = row_bytes(t, D);
      const auto before = cpu_store(t, x, Hkv * n_slots, D);
      // The CPU backend's re-rotation: dequantize, rotate by delta, quantize.
      std::vector<uint8_t> want = before;
      std::vector<float> row(D);
      for (int s = 0; s < n_slots; ++s)
        for (int h = 0; h < Hkv; ++h) {
          if (pos[size_t(s)] < first) continue;
          uint8_t* b = want.data() + (size_t(h) * n_slots + s) * rb;
          kvscope::cpu::load_row(t, b, row.data(), D);
          kvscope::cpu::rope_rows(row.data(), 1, 1, D,
                                  neox ? kvscope::RopeStyle::NeoX : kvscope::RopeStyle::Adjacent,
                                  n_rot, 10000.0f, 1.0f, delta);
          kvscope::cpu::store_row(t, row.data(), b, D);
        }
      DevVec<uint8_t> kc(before), vc(before);
      DevVec<int32_t> p(pos);
      const auto l = layer(kc.p, vc.p, t, t, Hkv, D, n_slots, p.p);
      ASSERT_EQ(kvscope::cuda::kv_rerotate(l, {n_rot, neox ? 1 : 0, 10000.0f, 1.0f}, first, delta,
                                          nullptr),
                cudaSuccess);
      const auto got = kc.get();
      EXPECT_EQ(vc.get(), before) << "V rows are not touched";
      const auto gf = cpu_load(t, got, Hkv * n_slots, D), wf = cpu_load(t, want, Hkv * n_slots, D);
      size_t same = 0, total = 0;
      for (int s = 0; s < n_slots; ++s)
        for (int h = 0; h < Hkv; ++h) {
          const size_t r = size_t(h) * n_slots + s;
          if (pos[size_t(s)] < first) {
            EXPECT_TRUE(std::equal(got.begin() + r * rb, got.begin() + (r + 1) * rb,
                                   before.begin() + r * rb))
                << "slot " << s << " head " << h << " changed";
            continue;
          }
          for (size_t i = 0; i < rb; ++i, ++total) same += got[r * rb + i] == want[r * rb + i];
          for (int blk = 0; blk < D / 32; ++blk) {
            uint16_t dh;
            std::memcpy(&dh, want.data() + r * rb + blk * (rb / (D / 32)), 2);
            const float step = std::fabs(kvscope::fp16_to_fp32(dh)) * 1.01f + 1e-6f;
            for (int i = blk * 32; i < blk * 32 + 32; ++i)
              ASSERT_LE(std::fabs(gf[r * D + i] - wf[r * D + i]), step)
                  << "slot " << s << " head " << h << " dim " << i;
          }
        }
      EXPECT_GE(double(same), 0.99 * double(total));
    }
  }
}

TEST_F(KernelKvQuant, BlockTypesNeedHeadDimsOfWholeBlocks) {
  DevVec<uint8_t> k(1024), v(1024);
  DevVec<float> x(80);
  DevVec<int32_t> p(std::vector<int32_t>{-1, -1});
  const auto l = layer(k.p, v.p, KvDtype::Q8_0, KvDtype::F16, 1, 40, 2, p.p);
  EXPECT_EQ(kvscope::cuda::kv_write(l, x.p, x.p, 1, 0, nullptr), cudaErrorInvalidValue);
  auto bad = l;
  bad.v_type = KvElem(7);  // not a cache type
  bad.k_type = KvElem::F16;
  EXPECT_EQ(kvscope::cuda::kv_write(bad, x.p, x.p, 1, 0, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvscope::test
