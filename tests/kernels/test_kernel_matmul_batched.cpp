// test_kernel_matmul_batched.cpp — the batched quantized product (matmul_batched.cu)
// under the CUDA emulator against a double-precision product of the engine's CPU
// dequantization, for every type the kernels decode.
//
// Tolerance: fp32 accumulation of n_in exact products in input order against a double
// reference; the error bound is ~n_in * eps * sum|w x|, here 1e-5 of the output's sum of
// |w x| plus 1e-6 absolute (the same bound as the matvec tests). Independence from the
// batch is exact: a row's sum order does not depend on T or on the other rows.
#include <cmath>

#include "engine/quant.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/quant_test_util.h"

namespace {

using kvscope::GgmlType;
using kvscope::cuda::QMatrix;
using kvscope::cuda::QType;
using kvscope::test::DevVec;
using kvscope::test::HostMatrix;
using kvscope::test::qmatrix;
using kvscope::test::random_floats;
using kvscope::test::random_matrix;

class KernelMatmulBatched : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

const GgmlType kEveryType[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                               GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                               GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// out [T][n_out] in double, and each output's sum of |w x| (the error scale).
std::vector<double> reference(const std::vector<float>& W, const std::vector<float>& x,
                              int64_t n_in, int64_t n_out, int T, std::vector<double>* mag) {
  std::vector<double> out(size_t(T * n_out));
  mag->assign(out.size(), 0.0);
  for (int t = 0; t < T; ++t)
    for (int64_t o = 0; o < n_out; ++o) {
      double acc = 0, m = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double p = double(W[size_t(o * n_in + i)]) * x[size_t(t * n_in + i)];
        acc += p;
        m += std::fabs(p);
      }
      out[size_t(t * n_out + o)] = acc;
      (*mag)[size_t(t * n_out + o)] = m;
    }
  return out;
}

TEST_F(KernelMatmulBatched, EveryTypeMatchesReferenceAtBatchSizes) {
  // n_out odd and not a multiple of the 64-row tile; T below, at and past one 64-row tile
  // and not a multiple of the 16-thread side; n_in more than one 32-value chunk.
  for (GgmlType type : kEveryType) {
    const bool k_quant = kvscope::type_traits(type)->block_size == 256;
    const int64_t n_in = k_quant ? 512 : 96, n_out = 67;
    HostMatrix w = random_matrix(type, n_in, n_out, 21);
    const std::vector<float> W = w.dequant();
    DevVec<uint8_t> dw(w.bytes);
    for (int T : {9, 16, 17, 33, 64, 65}) {
      SCOPED_TRACE(std::string(kvscope::ggml_type_name(type)) + " T " + std::to_string(T));
      const std::vector<float> x = random_floats(size_t(T * n_in), 7 + uint32_t(T));
      DevVec<float> dx(x), out(size_t(T * n_out));
      ASSERT_EQ(kvscope::cuda::matmul_batched(qmatrix(w, dw.p), dx.p, T, out.p, nullptr),
                cudaSuccess)
          << kvscope::cuda::error_detail();
      std::vector<double> mag;
      const std::vector<double> want = reference(W, x, n_in, n_out, T, &mag);
      const std::vector<float> got = out.get();
      int bad = 0;
      for (size_t i = 0; i < want.size() && bad < 5; ++i)
        if (!(std::fabs(double(got[i]) - want[i]) <= 1e-5 * mag[i] + 1e-6)) {
          ADD_FAILURE() << "out[" << i / size_t(n_out) << "][" << i % size_t(n_out)
                        << "] = " << got[i] << ", want " << want[i];
          ++bad;
        }
    }
  }
}

TEST_F(KernelMatmulBatched, RowResultDoesNotDependOnTheBatch) {
  // Row t of a T = 40 product equals the same row computed in a T = 9 product, bit for
  // bit: a graph padded or grown by rows gives every row the same numbers.
  const HostMatrix w = random_matrix(GgmlType::Q4_K, 256, 33, 4);
  DevVec<uint8_t> dw(w.bytes);
  const std::vector<float> x = random_floats(size_t(40 * 256), 12);
  DevVec<float> dx(x), big(size_t(40 * 33)), small(size_t(9 * 33));
  ASSERT_EQ(kvscope::cuda::matmul_batched(qmatrix(w, dw.p), dx.p, 40, big.p, nullptr), cudaSuccess);
  ASSERT_EQ(kvscope::cuda::matmul_batched(qmatrix(w, dw.p), dx.p, 9, small.p, nullptr),
            cudaSuccess);
  const std::vector<float> b = big.get(), s = small.get();
  for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(b[i], s[i]) << "i " << i;
}

TEST_F(KernelMatmulBatched, RejectsPartialBlocksAndUnknownTypes) {
  DevVec<uint8_t> w(4096);
  DevVec<float> x(16 * 512), out(16 * 8);
  // 48 values are not whole Q8_0 blocks; 300 not whole Q4_K super-blocks.
  EXPECT_EQ(
      kvscope::cuda::matmul_batched(QMatrix{w.p, QType::Q8_0, 48, 2, 51}, x.p, 16, out.p, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(kvscope::cuda::matmul_batched(QMatrix{w.p, QType::Q4_K, 300, 2, 170}, x.p, 16, out.p,
                                          nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      kvscope::cuda::matmul_batched(QMatrix{w.p, QType(99), 256, 2, 144}, x.p, 16, out.p, nullptr),
      cudaErrorInvalidValue);
  EXPECT_TRUE(kvscope::cuda::matmul_batched_supported(QType::Q6_K));
  EXPECT_FALSE(kvscope::cuda::matmul_batched_supported(QType(99)));
}

}  // namespace
