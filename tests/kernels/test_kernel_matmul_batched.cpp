// test_kernel_matmul_batched.cpp — the batched quantized product (matmul_batched.cu)
// under the CUDA emulator against a double-precision product of the engine's CPU
// dequantization, for every type the kernels decode.
//
// Tolerance: fp32 accumulation of n_in exact products in input order against a double
// reference; the error bound is ~n_in * eps * sum|w x|, here 1e-5 of the output's sum of
// |w x| plus 1e-6 absolute (the same bound as the matvec tests). Independence from the
// batch is exact: a row's sum order does not depend on T or on the other rows. Both forms
// run: one block per tile (no work memory), and the input split over several blocks per
// tile (work memory and counters, as the CUDA backend runs it).
#include <algorithm>
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

// matmul_batched with or without the split input; the counters must be left zero.
cudaError_t run_batched(QMatrix w, const float* x, int T, float* out, bool split) {
  if (!split) return kvscope::cuda::matmul_batched(w, x, T, out, nullptr, nullptr, kvscope::cuda::kBatchedTargetBlocks, nullptr);
  DevVec<float> work(size_t(std::max<int64_t>(kvscope::cuda::matmul_batched_work_floats(w, T), 1)));
  const int n = std::max(kvscope::cuda::matmul_batched_counters(w, T), 1);
  DevVec<unsigned> counters(std::vector<unsigned>(size_t(n), 0u));
  const cudaError_t e = kvscope::cuda::matmul_batched(w, x, T, out, work.p, counters.p, kvscope::cuda::kBatchedTargetBlocks, nullptr);
  if (e == cudaSuccess) {
    for (unsigned c : counters.get()) EXPECT_EQ(c, 0u) << "a counter was not put back to zero";
  }
  return e;
}

TEST_F(KernelMatmulBatched, EveryTypeMatchesReferenceAtBatchSizes) {
  // n_out odd and not a multiple of the 64-row tile; T below, at and past one 64-row tile
  // and not a multiple of the 16-thread side; n_in more than one 32-value chunk. Two
  // tiles of rows: the split form cuts the input into as many splits as it has chunks.
  for (GgmlType type : kEveryType) {
    const bool k_quant = kvscope::type_traits(type)->block_size == 256;
    const int64_t n_in = k_quant ? 512 : 96, n_out = 67;
    HostMatrix w = random_matrix(type, n_in, n_out, 21);
    const std::vector<float> W = w.dequant();
    DevVec<uint8_t> dw(w.bytes);
    EXPECT_EQ(kvscope::cuda::matmul_batched_splits(qmatrix(w, dw.p)), int(n_in / 32));
    for (bool split : {false, true})
      for (int T : {9, 16, 17, 33, 64, 65}) {
        SCOPED_TRACE(std::string(kvscope::ggml_type_name(type)) + " T " + std::to_string(T) +
                     (split ? " split" : ""));
        const std::vector<float> x = random_floats(size_t(T * n_in), 7 + uint32_t(T));
        DevVec<float> dx(x), out(size_t(T * n_out));
        ASSERT_EQ(run_batched(qmatrix(w, dw.p), dx.p, T, out.p, split), cudaSuccess)
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
  // bit: a graph padded or grown by rows gives every row the same numbers. In both forms.
  const HostMatrix w = random_matrix(GgmlType::Q4_K, 256, 33, 4);
  DevVec<uint8_t> dw(w.bytes);
  const std::vector<float> x = random_floats(size_t(40 * 256), 12);
  for (bool split : {false, true}) {
    DevVec<float> dx(x), big(size_t(40 * 33)), small(size_t(9 * 33));
    ASSERT_EQ(run_batched(qmatrix(w, dw.p), dx.p, 40, big.p, split), cudaSuccess);
    ASSERT_EQ(run_batched(qmatrix(w, dw.p), dx.p, 9, small.p, split), cudaSuccess);
    const std::vector<float> b = big.get(), s = small.get();
    for (size_t i = 0; i < s.size(); ++i) ASSERT_EQ(b[i], s[i]) << "i " << i << " split " << split;
  }
}

TEST_F(KernelMatmulBatched, SplitsComeFromTheShapeAlone) {
  // About 256 blocks (the default target) for a matrix of few row tiles, never more splits
  // than 32-value chunks, and one block per tile once the tiles alone fill the GPU.
  const auto q = [](int64_t n_in, int64_t n_out) {
    return QMatrix{nullptr, QType::Q4_1, n_in, n_out, n_in / 32 * 20};
  };
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 576)), 18);   // 29 wanted, 18 chunks
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 1536)), 9);   // 24 tiles x 9, 2 chunks
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(1536, 576)), 24);  // 9 tiles x 24
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 192)), 18);   // 3 tiles, 18 chunks
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 49152)), 1);  // 768 tiles
  EXPECT_EQ(kvscope::cuda::matmul_batched_work_floats(q(576, 49152), 64), 0);
  EXPECT_EQ(kvscope::cuda::matmul_batched_work_floats(q(576, 576), 16), 18 * 16 * 576);
  EXPECT_EQ(kvscope::cuda::matmul_batched_counters(q(576, 576), 65), 9 * 2);
  // Another target (CudaBackendOptions::batched_target_blocks): 64 blocks.
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 576), 64), 6);  // 8 wanted: 3 chunks each
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 1536), 64), 3);
  EXPECT_EQ(kvscope::cuda::matmul_batched_splits(q(576, 49152), 64), 1);
  EXPECT_EQ(kvscope::cuda::matmul_batched_work_floats(q(576, 576), 16, 64), 6 * 16 * 576);
}

TEST_F(KernelMatmulBatched, RejectsPartialBlocksAndUnknownTypes) {
  DevVec<uint8_t> w(4096);
  DevVec<float> x(16 * 512), out(16 * 8);
  // 48 values are not whole Q8_0 blocks; 300 not whole Q4_K super-blocks.
  EXPECT_EQ(kvscope::cuda::matmul_batched(QMatrix{w.p, QType::Q8_0, 48, 2, 51}, x.p, 16, out.p,
                                          nullptr, nullptr, kvscope::cuda::kBatchedTargetBlocks, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kvscope::cuda::matmul_batched(QMatrix{w.p, QType::Q4_K, 300, 2, 170}, x.p, 16, out.p,
                                          nullptr, nullptr, kvscope::cuda::kBatchedTargetBlocks, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kvscope::cuda::matmul_batched(QMatrix{w.p, QType(99), 256, 2, 144}, x.p, 16, out.p,
                                          nullptr, nullptr, kvscope::cuda::kBatchedTargetBlocks, nullptr),
            cudaErrorInvalidValue);
  EXPECT_TRUE(kvscope::cuda::matmul_batched_supported(QType::Q6_K));
  EXPECT_FALSE(kvscope::cuda::matmul_batched_supported(QType(99)));
}

}  // namespace
