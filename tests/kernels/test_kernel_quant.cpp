// test_kernel_quant.cpp — embedding gather, dequantize-to-fp32 and the quantized and fp32
// matvecs under the CUDA emulator against the engine's CPU dequantizer.
//
// Tolerances:
//  - embed: the same fp32 formula per value (q * d [+ m]); only a fused multiply-add on
//    one side can differ, so 1 ulp-level: 2e-7 relative + 1e-7 absolute.
//  - dequantize_f32: the same fp32 value formula as the CPU (q * d [+ m], K-quant scales);
//    a fused multiply-add on one side can move the last bit: 2e-7 relative + 1e-9 absolute.
//  - matvec: fp32 accumulation in a different order than the double reference; the error
//    bound is ~n_in * eps * sum|w x|, here 1e-5 of the row's sum of |w x|.
#include <cstring>

#include "engine/quant.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/quant_test_util.h"

namespace {

using kvscope::GgmlType;
using kvscope::cuda::QMatrix;
using kvscope::cuda::QType;
using kvscope::test::all_close;
using kvscope::test::HostMatrix;
using kvscope::test::qmatrix;
using kvscope::test::random_matrix;
using kvscope::test::DevVec;
using kvscope::test::random_floats;

class KernelQuant : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

TEST_F(KernelQuant, EmbedGathersDequantizedRows) {
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::F32, GgmlType::F16, GgmlType::Q4_1}) {
    const int64_t C = 96, V = 41;
    HostMatrix tab = random_matrix(type, C, V, 11);
    DevVec<uint8_t> dtab(tab.bytes);
    const std::vector<int32_t> ids = {40, 0, 7, 7, 23};
    DevVec<int32_t> dids(ids);
    DevVec<float> out(ids.size() * C);
    ASSERT_EQ(kvscope::cuda::embed(qmatrix(tab, dtab.p), dids.p, int(ids.size()), 1.0f, out.p,
                                  nullptr),
              cudaSuccess)
        << kvscope::cuda::error_detail();
    const std::vector<float> all = tab.dequant();
    std::vector<float> want;
    for (int32_t id : ids) want.insert(want.end(), all.begin() + id * C, all.begin() + (id + 1) * C);
    EXPECT_TRUE(all_close(out.get(), want, 1e-7f, 2e-7f)) << kvscope::ggml_type_name(type);
    // With a scale (Gemma's sqrt(C)) every value is the same product in fp32.
    DevVec<float> scaled(ids.size() * C);
    ASSERT_EQ(kvscope::cuda::embed(qmatrix(tab, dtab.p), dids.p, int(ids.size()), 8.0f, scaled.p,
                                  nullptr),
              cudaSuccess);
    std::vector<float> want8 = out.get();
    for (float& f : want8) f *= 8.0f;
    EXPECT_TRUE(all_close(scaled.get(), want8, 0.f, 0.f)) << kvscope::ggml_type_name(type);
  }
}

TEST_F(KernelQuant, DequantizeToF32MatchesCpuForEveryType) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                        GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const int64_t n_in = kvscope::type_traits(type)->block_size == 256 ? 512 : 96, n_out = 5;
    HostMatrix w = random_matrix(type, n_in, n_out, 3);
    DevVec<uint8_t> dw(w.bytes);
    DevVec<float> out(size_t(n_in * n_out));
    ASSERT_EQ(kvscope::cuda::dequantize_f32(qmatrix(w, dw.p), out.p, nullptr), cudaSuccess);
    EXPECT_TRUE(all_close(out.get(), w.dequant(), 1e-9f, 2e-7f)) << kvscope::ggml_type_name(type);
  }
}

std::vector<float> ref_matmul(const std::vector<float>& W, const std::vector<float>& x,
                              int64_t n_in, int64_t n_out, int T, std::vector<float>* bound) {
  std::vector<float> out(size_t(T * n_out));
  bound->assign(out.size(), 0.f);
  for (int t = 0; t < T; ++t)
    for (int64_t o = 0; o < n_out; ++o) {
      double acc = 0, mag = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        acc += double(W[o * n_in + i]) * x[t * n_in + i];
        mag += std::fabs(double(W[o * n_in + i]) * x[t * n_in + i]);
      }
      out[t * n_out + o] = float(acc);
      (*bound)[t * n_out + o] = float(mag);
    }
  return out;
}

TEST_F(KernelQuant, MatvecNativeAndF32MatchReference) {
  // n_out not a multiple of the 8 rows per block; n_in = 3 blocks (fewer units than lanes)
  // and 40 blocks (lanes loop); T crosses the 4-rows-at-a-time chunk.
  for (GgmlType type : {GgmlType::Q4_1, GgmlType::Q8_0}) {
    for (int64_t n_in : {96, 1280}) {
      for (int T : {1, 3, 6}) {
        const int64_t n_out = 37;
        HostMatrix w = random_matrix(type, n_in, n_out, 5);
        const std::vector<float> x = random_floats(size_t(T * n_in), 9);
        DevVec<uint8_t> dw(w.bytes);
        DevVec<float> dx(x), out(size_t(T * n_out)), out32(size_t(T * n_out));
        DevVec<float> w32(size_t(n_in * n_out));
        ASSERT_EQ(kvscope::cuda::matmul(qmatrix(w, dw.p), dx.p, T, out.p, nullptr), cudaSuccess)
            << kvscope::cuda::error_detail();
        ASSERT_EQ(kvscope::cuda::dequantize_f32(qmatrix(w, dw.p), w32.p, nullptr), cudaSuccess);
        ASSERT_EQ(kvscope::cuda::matmul_f32(w32.p, n_in, n_out, dx.p, T, out32.p, nullptr),
                  cudaSuccess);
        std::vector<float> bound;
        const std::vector<float> want = ref_matmul(w.dequant(), x, n_in, n_out, T, &bound);
        const std::vector<float> got = out.get(), got32 = out32.get();
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5f * bound[i] + 1e-6f)
              << kvscope::ggml_type_name(type) << " n_in " << n_in << " T " << T << " i " << i;
          // The fp32 copy holds the exact weights: the same fp32 accumulation bound.
          ASSERT_NEAR(got32[i], want[i], 1e-5f * bound[i] + 1e-6f) << "f32 i " << i;
        }
      }
    }
  }
}

TEST_F(KernelQuant, MatvecRejectsUnsupportedTypeAndRowLength) {
  DevVec<uint8_t> w(1024);
  DevVec<float> x(64), out(8);
  EXPECT_EQ(kvscope::cuda::matmul(QMatrix{w.p, QType::Q4_K, 256, 2, 144}, x.p, 1, out.p, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kvscope::cuda::matmul(QMatrix{w.p, QType::Q8_0, 48, 2, 51}, x.p, 1, out.p, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
