// test_matmul.cpp — the CPU matrix-product kernels on every dispatch path (AVX-512, AVX2,
// scalar; forced with set_isa) and every weight type, against a scalar reference, on odd
// shapes: row counts that fill no tile, T = 1 to 17, 64, 70, 130, 513, float rows whose length
// is no multiple of anything.
//
// Two references:
//  - exact: the arithmetic the kernels promise (engine/cpu/kernels_impl.h), written out
//    here from the ggml block definitions with plain scalar code: for the float types
//    W[o][0]·x[0] + W[o][1]·x[1] + ... in order, each step one std::fma; for the quantized
//    ones the same over each segment's integers q, then the segment's scale d and offset
//    m applied once (exact_dot). Every path, T and thread count must equal it bit for
//    bit — which is what keeps KV CACHE and NO CACHE identical;
//  - independent: the engine's dequantize_row and a float64 dot, within a bound on fp32
//    rounding, so the decoding formulas themselves are checked against ggml's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/packed_weight.h"
#include "engine/model.h"
#include "engine/quant.h"
#include "tests/util/gguf_writer.h"
#include "tests/util/isa_paths.h"
#include "tests/util/skip_reason.h"

namespace kvscope {
namespace {

using cpu::Isa;

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                           GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

uint16_t u16_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float half_at(const uint8_t* p) {
  return fp16_to_fp32(u16_at(p));
}

// A matrix of random rows: real values quantized where the test writer can, else random
// block bytes with small sane fp16 scales.
struct Matrix {
  GgmlType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> bytes;
  Weight weight() const {
    Weight w;
    w.name = "test";
    w.type = type;
    w.n_in = n_in;
    w.n_out = n_out;
    w.data = bytes.data();
    w.row_bytes = row_bytes(type, uint64_t(n_in));
    return w;
  }
};

Matrix random_matrix(GgmlType t, int64_t n_in, int64_t n_out, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Matrix m{t, n_in, n_out, {}};
  switch (t) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1: {
      std::vector<float> v(size_t(n_in * n_out));
      for (float& x : v) x = u(rng);
      m.bytes = test::quantize_rows(t, v, uint64_t(n_in));
      return m;
    }
    default:
      break;
  }
  const TypeTraits* tt = type_traits(t);
  m.bytes.resize(row_bytes(t, uint64_t(n_in)) * uint64_t(n_out));
  for (uint8_t& b : m.bytes) b = uint8_t(rng());
  for (size_t blk = 0; blk < m.bytes.size() / tt->type_size; ++blk) {
    uint8_t* p = m.bytes.data() + blk * tt->type_size;
    auto scale = [&](size_t at) {
      const uint16_t h = fp32_to_fp16(u(rng) * 0.05f);
      std::memcpy(p + at, &h, 2);
    };
    if (t == GgmlType::Q6_K) {
      scale(208);
    } else {
      scale(0);
      if (t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K) scale(2);
    }
  }
  return m;
}

// A float row's value k (F32, F16, BF16).
float float_value(GgmlType t, const uint8_t* row, int64_t k) {
  switch (t) {
    case GgmlType::F32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case GgmlType::F16:
      return half_at(row + 2 * k);
    default:
      return bf16_to_fp32(u16_at(row + 2 * k));
  }
}

// Values per segment of a quantized type: one scale d (and offset m) per segment.
int segment_values(GgmlType t) {
  return t == GgmlType::Q6_K ? 16 : 32;
}

// The integer q of a quantized row's value k, as the kernels use it (see kernels_impl.h),
// from the ggml block layout (docs/engine.md, "Quant blocks, bit by bit"): the value is
// q·d + m with d and m those of kernel_scales.
int kernel_q(GgmlType t, const uint8_t* row, int64_t k) {
  auto nib = [](const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4; };
  const TypeTraits* tt = type_traits(t);
  const uint8_t* b = row + (k / tt->block_size) * tt->type_size;
  const int j = int(k % tt->block_size);
  switch (t) {
    case GgmlType::Q8_0:
      return int8_t(b[2 + j]);
    case GgmlType::Q4_0:
      return nib(b + 2, j) - 8;
    case GgmlType::Q4_1:
      return nib(b + 4, j);
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool m = t == GgmlType::Q5_1;
      uint32_t h;
      std::memcpy(&h, b + (m ? 4 : 2), 4);
      const int q = nib(b + (m ? 8 : 6), j) | int(((h >> j) & 1u) << 4);
      return m ? q : q - 16;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // Q5_K: the nibbles 32 bytes later, past qh; bit j/32 of qh[j%32]
      const bool q5 = t == GgmlType::Q5_K;
      const int s = j / 32, g = j / 64, l = j % 32;
      const uint8_t byte = b[(q5 ? 48 : 16) + 32 * g + l];
      return (s % 2 == 0 ? byte & 0xF : byte >> 4) | (q5 ? ((b[16 + l] >> s) & 1) << 4 : 0);
    }
    case GgmlType::Q6_K: {
      const int n = j / 128, q = (j % 128) / 32, l = j % 32;
      const uint8_t ql = b[64 * n + l + 32 * (q & 1)];
      const int lo = q < 2 ? ql & 0xF : ql >> 4;
      const int hi = (b[128 + 32 * n + l] >> (2 * q)) & 3;
      return (lo | (hi << 4)) - 32;
    }
    default:
      return 0;
  }
}

// The scale d and offset m (0 where the type has none) of the segment holding value k.
std::pair<float, float> kernel_scales(GgmlType t, const uint8_t* row, int64_t k) {
  const TypeTraits* tt = type_traits(t);
  const uint8_t* b = row + (k / tt->block_size) * tt->type_size;
  const int j = int(k % tt->block_size);
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
      return {half_at(b), 0.0f};
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
      return {half_at(b), half_at(b + 2)};
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const int s = j / 32;
      const uint8_t* sc = b + 4;
      int scale, min;
      if (s < 4) {
        scale = sc[s] & 63;
        min = sc[s + 4] & 63;
      } else {
        scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
        min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
      }
      return {half_at(b) * float(scale), -(half_at(b + 2) * float(min))};
    }
    case GgmlType::Q6_K:
      return {half_at(b + 208) * float(int8_t(b[192 + j / 16])), 0.0f};
    default:
      return {NAN, NAN};
  }
}

bool has_offsets(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
}

// One output by the kernels' fixed arithmetic. Float types: acc = W[0]·x[0] + W[1]·x[1]
// + ..., each step one std::fma, from 0. Quantized types, per segment of S values in
// order: s_q = q_0·x_0 + q_1·x_1 + ... (std::fma, from 0), then acc = fma(d, s_q, acc) and,
// with an offset, acc = fma(m, Σx, acc), Σx the segment's x summed in order from 0.
float exact_dot(GgmlType t, const uint8_t* row, const float* x, int64_t n) {
  float acc = 0.0f;
  if (type_traits(t)->block_size == 1) {
    for (int64_t k = 0; k < n; ++k) acc = std::fma(float_value(t, row, k), x[k], acc);
    return acc;
  }
  const int S = segment_values(t);
  for (int64_t k0 = 0; k0 < n; k0 += S) {
    float sq = 0.0f, sx = 0.0f;
    for (int64_t k = k0; k < k0 + S; ++k) {
      sq = std::fma(float(kernel_q(t, row, k)), x[k], sq);
      sx += x[k];
    }
    const auto [d, m] = kernel_scales(t, row, k0);
    acc = std::fma(d, sq, acc);
    if (has_offsets(t)) acc = std::fma(m, sx, acc);
  }
  return acc;
}

// The exact reference: out[t][o] by the kernels' fixed arithmetic.
std::vector<float> exact_reference(const Matrix& m, const std::vector<float>& x, int64_t T) {
  const uint64_t rb = row_bytes(m.type, uint64_t(m.n_in));
  std::vector<float> out(size_t(T * m.n_out));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < m.n_out; ++o)
      out[size_t(t * m.n_out + o)] =
          exact_dot(m.type, m.bytes.data() + uint64_t(o) * rb, x.data() + t * m.n_in, m.n_in);
  return out;
}

std::vector<float> random_x(int64_t T, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(size_t(T * n));
  for (float& v : x) v = u(rng);
  return x;
}

std::vector<int64_t> lengths_for(GgmlType t) {
  const int64_t bs = type_traits(t)->block_size;
  if (bs == 1) return {7, 33, 100};
  if (bs == 32) return {32, 96, 160};
  return {256, 512};
}

// Restores the path chosen at start-up after each test.
class Matmul : public ::testing::Test {
 protected:
  void TearDown() override { cpu::set_isa(saved_); }
  const Isa saved_ = cpu::isa_active();
};

// The tests that run once per path (".../scalar", ".../avx2", ".../avx512"); a path this
// CPU lacks is reported as skipped (tests/util/isa_paths.h).
class MatmulPath : public test::IsaPathTest {};
KVSCOPE_TEST_EVERY_ISA(MatmulPath);

TEST_P(MatmulPath, EveryTypeEqualsTheExactReferenceBitForBit) {
  ThreadPool pool(2);
  const Isa isa = this->isa();
  for (GgmlType t : kTypes)
    for (int64_t n_in : lengths_for(t))
      for (int64_t n_out : {5, 83}) {
        const Matrix m = random_matrix(t, n_in, n_out, uint32_t(n_in * 131 + n_out));
        auto packed = cpu::pack_weight(m.weight(), pool);
        ASSERT_TRUE(packed) << ggml_type_name(t);
        // 5..16: a batch of decode rows, gemv over slices of 8 (AVX-512) or 4 rows and what
        // is left over (1 to 4 rows); past one slice the quantized types decode each segment
        // once for up to 64 rows (10, 11, 70, 130: a last slice of 2 or 3 rows, a last
        // block of rows shorter than a slice).
        // Under a CPU emulator (tests/util/isa_paths.h): one T per branch of each path.
        const std::vector<int64_t> Ts =
            test::emulated_cpu()
                ? std::vector<int64_t>{1, 3, 11, 17}
                : std::vector<int64_t>{1, 3, 5, 8, 10, 11, 12, 16, 17, 64, 70, 130, 513};
        for (int64_t T : Ts) {
          const auto x = random_x(T, n_in, uint32_t(T + n_in));
          const auto want = exact_reference(m, x, T);
          std::vector<float> got(want.size(), NAN);
          cpu::matmul(pool, *packed, x.data(), T, got.data());
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[i], want[i])
                << cpu::isa_name(isa) << " " << ggml_type_name(t) << " n_in=" << n_in
                << " n_out=" << n_out << " T=" << T << " token " << i / size_t(n_out) << " row "
                << i % size_t(n_out);
        }
      }
}

// Enough rows for several decoded panels per chunk and several chunks per thread (the
// threads claim chunks in whatever order they get to them), an odd group count, and two
// products in one region whose chunks straddle the boundary between them: still the
// exact reference, bit for bit, on every path and type.
TEST_P(MatmulPath, ManyRowsOverSeveralPanelsAndChunksEqualTheExactReference) {
  ThreadPool pool(3);
  const Isa isa = this->isa();
  for (GgmlType t : kTypes) {
    const int64_t n_in = lengths_for(t).front(), n_out = 300, n_out2 = 45;
    const Matrix m = random_matrix(t, n_in, n_out, uint32_t(n_in + 17));
    const Matrix m2 = random_matrix(t, n_in, n_out2, uint32_t(n_in + 18));
    const std::vector<int64_t> Ts =
        test::emulated_cpu() ? std::vector<int64_t>{1, 17} : std::vector<int64_t>{1, 64, 513};
    for (int64_t T : Ts) {
      const auto x = random_x(T, n_in, uint32_t(T * 3 + n_in));
      const auto want = exact_reference(m, x, T), want2 = exact_reference(m2, x, T);
      auto packed = cpu::pack_weight(m.weight(), pool);
      auto packed2 = cpu::pack_weight(m2.weight(), pool);
      ASSERT_TRUE(packed && packed2) << ggml_type_name(t);
      std::vector<float> got(want.size(), NAN), got2(want2.size(), NAN);
      const cpu::MatmulJob jobs[2] = {{packed.get(), got.data()}, {packed2.get(), got2.data()}};
      cpu::matmul_many(pool, jobs, 2, x.data(), T);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], want[i])
            << cpu::isa_name(isa) << " " << ggml_type_name(t) << " T=" << T << " token "
            << i / size_t(n_out) << " row " << i % size_t(n_out);
      for (size_t i = 0; i < want2.size(); ++i)
        ASSERT_EQ(got2[i], want2[i])
            << cpu::isa_name(isa) << " " << ggml_type_name(t) << " second product T=" << T
            << " token " << i / size_t(n_out2) << " row " << i % size_t(n_out2);
    }
  }
}

// Products of more rows than one slice take the rows kernel or the gemv slices as the CPU
// is measured faster with (rows_kernel_on: the slices with AVX-512 on Zen 5, the rows
// kernel elsewhere); whichever this CPU gets by default, both must give the exact
// reference bit for bit, in both nibble orders, on every path: rows past a slice (10, 16),
// more than one 64-row block (70, 130) and a long prefill (513).
TEST_P(MatmulPath, RowsKernelAndGemvSlicesBothEqualTheExactReference) {
  struct Restore {
    ~Restore() { cpu::set_rows_kernel(std::nullopt); }
  } restore;
  ThreadPool pool(2);
  const Isa isa = this->isa();
  const std::vector<int64_t> Ts = test::emulated_cpu() ? std::vector<int64_t>{11, 17}
                                                       : std::vector<int64_t>{10, 16, 70, 130, 513};
  for (GgmlType t : kTypes) {
    const int64_t n_in = lengths_for(t).back(), n_out = 83;
    const Matrix m = random_matrix(t, n_in, n_out, uint32_t(n_in * 7 + 5));
    std::vector<cpu::NibbleOrder> orders = {cpu::NibbleOrder::Bytes};
    if (cpu::has_nibble_words(t)) orders.push_back(cpu::NibbleOrder::Words);
    for (cpu::NibbleOrder order : orders) {
      auto packed = cpu::pack_weight(m.weight(), pool, order);
      ASSERT_TRUE(packed) << ggml_type_name(t);
      for (int64_t T : Ts) {
        const auto x = random_x(T, n_in, uint32_t(T * 5 + n_in));
        const auto want = exact_reference(m, x, T);
        for (bool rows : {true, false}) {
          cpu::set_rows_kernel(rows);
          std::vector<float> got(want.size(), NAN);
          cpu::matmul(pool, *packed, x.data(), T, got.data());
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[i], want[i])
                << cpu::isa_name(isa) << " " << ggml_type_name(t)
                << (order == cpu::NibbleOrder::Words ? " words" : " bytes")
                << (rows ? " rows kernel" : " gemv slices") << " T=" << T << " token "
                << i / size_t(n_out) << " row " << i % size_t(n_out);
        }
      }
    }
  }
}

// Q4_0, Q4_1 and Q4_K in both nibble orders (packed_weight.h), whichever the path would
// pick: the exact reference bit for bit at every kernel's T (1: the decode step, 3 and 4:
// gemv slices, 5 to 513: rows or panel). With x scaled far down (every value below 2^-98,
// where x·2^-24 would be subnormal and lose bits) the Words order must fall back to
// decoding q exactly: the sums are then tiny too, so a scaled x that lost bits would show.
TEST_P(MatmulPath, BothNibbleOrdersEqualTheExactReferenceEvenForTinyX) {
  ThreadPool pool(2);
  const Isa isa = this->isa();
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K})
    for (cpu::NibbleOrder order : {cpu::NibbleOrder::Bytes, cpu::NibbleOrder::Words}) {
      const int64_t n_in = lengths_for(t).back(), n_out = 83;
      const Matrix m = random_matrix(t, n_in, n_out, uint32_t(n_in + 5));
      auto packed = cpu::pack_weight(m.weight(), pool, order);
      ASSERT_TRUE(packed) << ggml_type_name(t);
      ASSERT_EQ(packed->nibbles, order);
      for (int64_t T : {1, 3, 4, 5, 17, 64, 513})
        for (float scale : {1.0f, 0x1p-120f}) {
          if (scale != 1.0f && T > 17) continue;  // only the gemv tiles read a scaled x
          auto x = random_x(T, n_in, uint32_t(T + 7));
          for (float& v : x) v *= scale;
          const auto want = exact_reference(m, x, T);
          std::vector<float> got(want.size(), NAN);
          cpu::matmul(pool, *packed, x.data(), T, got.data());
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[i], want[i]) << cpu::isa_name(isa) << " " << ggml_type_name(t)
                                       << (order == cpu::NibbleOrder::Words ? " words" : " bytes")
                                       << " T=" << T << " x scale " << scale << " token "
                                       << i / size_t(n_out) << " row " << i % size_t(n_out);
        }
    }
}

// The decode step's pre-scaled x for Words-ordered weights: value k times
// 2^-word_shift(k % 8), exactly; refused when a nonzero value is below 2^-98.
TEST(WordsX, ScalesEachValueByItsPositionInTheWordOrRefuses) {
  const int64_t T = 2, n = 64;
  auto x = random_x(T, n, 9);
  std::vector<float> xq(x.size(), NAN);
  ASSERT_TRUE(cpu::words_x(x.data(), T, n, xq.data()));
  for (int64_t i = 0; i < T * n; ++i)
    EXPECT_EQ(xq[size_t(i)], std::ldexp(x[size_t(i)], -cpu::word_shift(int(i % n % 8))))
        << "value " << i;
  x[70] = 0.0f;  // zero scales exactly
  EXPECT_TRUE(cpu::words_x(x.data(), T, n, xq.data()));
  x[70] = 0x1p-99f;
  EXPECT_FALSE(cpu::words_x(x.data(), T, n, xq.data()));
}

// The kernels' decoding against the engine's dequantize_row (ggml's formulas) and a
// float64 dot: only fp32 rounding apart. Sequential fp32 sums of n products are within
// about n·2^-24 of the exact sum, relative to Σ|w·x|.
TEST_F(Matmul, AgreesWithDequantizeAndAFloat64Dot) {
  ThreadPool pool(1);
  for (GgmlType t : kTypes)
    for (int64_t n_in : lengths_for(t)) {
      const int64_t n_out = 37, T = 9;
      const Matrix m = random_matrix(t, n_in, n_out, 77);
      auto packed = cpu::pack_weight(m.weight(), pool);
      ASSERT_TRUE(packed);
      const auto x = random_x(T, n_in, 5);
      std::vector<float> got(size_t(T * n_out));
      cpu::matmul(pool, *packed, x.data(), T, got.data());
      std::vector<float> w(static_cast<size_t>(n_in));
      const uint64_t rb = row_bytes(t, uint64_t(n_in));
      for (int64_t o = 0; o < n_out; ++o) {
        dequantize_row(t, m.bytes.data() + uint64_t(o) * rb, w.data(), n_in);
        for (int64_t tk = 0; tk < T; ++tk) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < n_in; ++k) {
            ref += double(w[size_t(k)]) * x[size_t(tk * n_in + k)];
            mag += std::fabs(double(w[size_t(k)]) * x[size_t(tk * n_in + k)]);
          }
          ASSERT_NEAR(got[size_t(tk * n_out + o)], ref, (double(n_in) + 4) * 6e-8 * mag + 1e-6)
              << ggml_type_name(t) << " n_in=" << n_in << " row " << o << " token " << tk;
        }
      }
    }
}

// The path the process starts on (KVSCOPE_CPU_ISA; ctest runs this once with avx2 and once
// with avx512 forced, tests/engine/CMakeLists.txt), alone: every weight type, bit for bit
// against the exact reference at the decode step (T = 1), a few decode rows (3), batches
// of decode rows in tiles of 8 rows and what is left over (9, 13, 16), the panel kernels
// (17, 64) and a long prefill (513), over row counts that fill whole gemv
// tiles of four groups and leave single groups and a part group over (150 rows: 9 full
// groups and 6 rows), on one thread and two (chunks split between tiles).
TEST_F(Matmul, TheStartPathEqualsTheExactReferenceForEveryTypeAndT) {
  const Isa isa = cpu::isa_active();
  const char* env = std::getenv("KVSCOPE_CPU_ISA");
  std::printf("path: %s (KVSCOPE_CPU_ISA=%s)\n", cpu::isa_name(isa), env ? env : "(unset)");
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (GgmlType t : kTypes) {
      const int64_t n_in = lengths_for(t).back();
      for (int64_t n_out : {150, 64}) {
        const Matrix m = random_matrix(t, n_in, n_out, uint32_t(n_in * 7 + n_out));
        auto packed = cpu::pack_weight(m.weight(), pool);
        ASSERT_TRUE(packed) << ggml_type_name(t);
        for (int64_t T : {1, 3, 9, 13, 16, 17, 64, 513}) {
          const auto x = random_x(T, n_in, uint32_t(T * 5 + n_in));
          const auto want = exact_reference(m, x, T);
          std::vector<float> got(want.size(), NAN);
          cpu::matmul(pool, *packed, x.data(), T, got.data());
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[i], want[i])
                << cpu::isa_name(isa) << " " << ggml_type_name(t) << " n_in=" << n_in
                << " n_out=" << n_out << " T=" << T << " threads=" << threads << " token "
                << i / size_t(n_out) << " row " << i % size_t(n_out);
        }
      }
    }
  }
  // The products ran on the fallback path, right, but not on the one asked for
  // (engine_matmul_exact_*), so the run says so, with the reason CI accepts for a path
  // this CPU lacks.
  if (env && cpu::isa_from_name(env) && *cpu::isa_from_name(env) != isa)
    GTEST_SKIP() << test::skip_isa_lacking(*cpu::isa_from_name(env)) << " (KVSCOPE_CPU_ISA="
                 << env << " ran on " << cpu::isa_name(isa) << ")";
}

// The per-segment sums of x that the types with offsets share across rows: each segment
// of 32 values summed in order from 0, per token; a tail shorter than 32 has none.
TEST(SegmentSums, SumEachSegmentOfEachTokenInOrder) {
  const int64_t T = 3, n = 100;  // 3 segments a token and a tail of 4
  const auto x = random_x(T, n, 21);
  std::vector<float> sx(size_t(T * 3), NAN);
  cpu::segment_sums(x.data(), T, n, sx.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < 3; ++s) {
      float want = 0.0f;
      for (int64_t k = 0; k < 32; ++k) want += x[size_t(t * n + s * 32 + k)];
      EXPECT_EQ(sx[size_t(t * 3 + s)], want) << "token " << t << " segment " << s;
    }
}

TEST_F(Matmul, ResultsDoNotDependOnTheThreadCount) {
  const Matrix m = random_matrix(GgmlType::Q4_1, 576, 700, 3);
  const auto x = random_x(33, 576, 4);
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    auto packed = cpu::pack_weight(m.weight(), pool);
    ASSERT_TRUE(packed);
    for (int64_t T : {1, 33}) {
      std::vector<float> out(size_t(T * 700));
      cpu::matmul(pool, *packed, x.data(), T, out.data());
      if (T != 33) continue;
      if (threads == 1) {
        first = out;
      } else {
        EXPECT_EQ(out, first) << threads << " threads";
      }
    }
  }
}

TEST_F(Matmul, SeveralJobsInOneRegionEqualSeparateProducts) {
  ThreadPool pool(2);
  const Matrix a = random_matrix(GgmlType::Q8_0, 96, 50, 1);
  const Matrix b = random_matrix(GgmlType::Q4_0, 96, 17, 2);
  auto pa = cpu::pack_weight(a.weight(), pool), pb = cpu::pack_weight(b.weight(), pool);
  ASSERT_TRUE(pa && pb);
  for (int64_t T : {1, 7}) {
    const auto x = random_x(T, 96, 9);
    std::vector<float> oa(size_t(T * 50)), ob(size_t(T * 17)), sa(oa.size()), sb(ob.size());
    const cpu::MatmulJob jobs[2] = {{pa.get(), oa.data()}, {pb.get(), ob.data()}};
    cpu::matmul_many(pool, jobs, 2, x.data(), T);
    cpu::matmul(pool, *pa, x.data(), T, sa.data());
    cpu::matmul(pool, *pb, x.data(), T, sb.data());
    EXPECT_EQ(oa, sa);
    EXPECT_EQ(ob, sb);
  }
}

// The backend packs a weight without a uid (built by hand) for the call alone, and
// gives the same numbers as a loaded (cached) one.
TEST_F(Matmul, BackendHandlesWeightsWithAndWithoutAUid) {
  auto backend = make_cpu_backend(2);
  const Matrix m = random_matrix(GgmlType::Q5_0, 160, 40, 8);
  const auto x = random_x(3, 160, 10);
  auto xs = backend->scratch(0, 3, 160);
  auto o1 = backend->scratch(1, 3, 40);
  ASSERT_TRUE(xs.ok() && o1.ok());
  std::memcpy(xs->data, x.data(), x.size() * 4);
  Weight w = m.weight();
  ASSERT_TRUE(backend->matmul(w, *xs, *o1).ok());
  const std::vector<float> a(o1->data, o1->data + 120);
  w.uid = 987654321;  // as if loaded: packed once, then reused
  ASSERT_TRUE(backend->matmul(w, *xs, *o1).ok());
  ASSERT_TRUE(backend->matmul(w, *xs, *o1).ok());
  const std::vector<float> b(o1->data, o1->data + 120);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, exact_reference(m, x, 3));
}

// The products' time with their weights in cache (kvscope bench's ceiling): a weight
// larger than the part timed (a 4.5 MB Q8_0 one: more than half of any L2 per thread) and
// a small one, each as loaded (packed once, kept), then a product of each again. The
// parts are views of the kept packed copies: timing them must leave those intact (the
// products give the same numbers as before, and a view that freed its data would show
// under the sanitizers), and a weight's time scales to its size, so the large weight
// alone takes longer than the small one alone.
TEST_F(Matmul, ProductsInCacheLeaveTheWeightsIntact) {
  auto backend = make_cpu_backend(2);
  const Matrix big = random_matrix(GgmlType::Q8_0, 1024, 4096, 21);
  const Matrix small = random_matrix(GgmlType::Q4_1, 1024, 64, 22);
  Weight wb = big.weight(), ws = small.weight();
  wb.uid = 987654322;
  ws.uid = 987654323;
  const auto x = random_x(1, 1024, 23);
  auto xs = backend->scratch(0, 1, 1024);
  auto ob = backend->scratch(1, 1, 4096);
  auto os = backend->scratch(2, 1, 64);
  ASSERT_TRUE(xs.ok() && ob.ok() && os.ok());
  std::memcpy(xs->data, x.data(), x.size() * 4);
  ASSERT_TRUE(backend->matmul(wb, *xs, *ob).ok());
  ASSERT_TRUE(backend->matmul(ws, *xs, *os).ok());
  const std::vector<float> before_b(ob->data, ob->data + 4096), before_s(os->data, os->data + 64);
  const auto both = backend->products_in_cache_ms({&wb, &ws}, 1);
  const auto big_ms = backend->products_in_cache_ms({&wb}, 1);
  const auto small_ms = backend->products_in_cache_ms({&ws}, 1);
  ASSERT_TRUE(both && big_ms && small_ms);
  EXPECT_TRUE(std::isfinite(*both) && *both > 0);
  EXPECT_GT(*big_ms, *small_ms);
  ASSERT_TRUE(backend->matmul(wb, *xs, *ob).ok());
  ASSERT_TRUE(backend->matmul(ws, *xs, *os).ok());
  EXPECT_EQ(before_b, std::vector<float>(ob->data, ob->data + 4096));
  EXPECT_EQ(before_s, std::vector<float>(os->data, os->data + 64));
  EXPECT_EQ(before_b, exact_reference(big, x, 1));
}

// Packing a loaded weight releases its file pages; reading them again gives the file's
// bytes, and the products still use every weight correctly.
TEST_F(Matmul, ReleasedWeightPagesReadBackUnchanged) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model absent";
  auto model = Model::load(KVSCOPE_DEFAULT_MODEL);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const Weight& w = (*model)->layers()[0].wq;
  const size_t bytes = size_t(w.row_bytes) * size_t(w.n_out);
  const std::vector<uint8_t> before(w.data, w.data + bytes);
  auto backend = make_cpu_backend(1);
  auto x = backend->scratch(0, 1, w.n_in);
  auto out = backend->scratch(1, 1, w.n_out);
  ASSERT_TRUE(x.ok() && out.ok());
  for (int64_t i = 0; i < w.n_in; ++i) x->data[i] = float(i % 7) - 3.0f;
  ASSERT_TRUE(backend->matmul(w, *x, *out).ok());  // packs, then releases the pages
  EXPECT_TRUE(std::equal(before.begin(), before.end(), w.data));
  std::vector<float> want(size_t(w.n_out)), row(size_t(w.n_in));
  for (int64_t o = 0; o < w.n_out; ++o) {
    dequantize_row(w.type, w.data + uint64_t(o) * w.row_bytes, row.data(), w.n_in);
    double s = 0, mag = 0;
    for (int64_t k = 0; k < w.n_in; ++k) {
      s += double(row[size_t(k)]) * x->data[k];
      mag += std::fabs(double(row[size_t(k)]) * x->data[k]);
    }
    ASSERT_NEAR(out->data[o], s, 1e-4 * mag + 1e-6) << "row " << o;
  }
}

// KVSCOPE_CPU_ISA picks the path at start-up, clamped to what the CPU can run; ctest
// runs this test once per value (tests/engine/CMakeLists.txt).
TEST(CpuIsa, StartsOnThePathTheEnvironmentNames) {
  const char* env = std::getenv("KVSCOPE_CPU_ISA");
  Isa want = cpu::isa_best();
  std::optional<Isa> named;
  if (env) {
    named = cpu::isa_from_name(env);
    ASSERT_TRUE(named.has_value()) << env;
    if (int(*named) < int(want)) want = *named;
  }
  EXPECT_EQ(cpu::isa_active(), want) << "KVSCOPE_CPU_ISA=" << (env ? env : "(unset)");
  std::printf("cpu: best %s, active %s\n", cpu::isa_name(cpu::isa_best()),
              cpu::isa_name(cpu::isa_active()));
  EXPECT_TRUE(cpu::isa_supported(Isa::Scalar));
  EXPECT_FALSE(cpu::isa_from_name("sse9").has_value());
  // A path this CPU lacks falls back to the best below it: right, but then this run did
  // not test the path it was asked to (engine_cpu_isa_env_*), so it says so.
  if (named && *named != cpu::isa_active())
    GTEST_SKIP() << test::skip_isa_lacking(*named) << " (KVSCOPE_CPU_ISA=" << env << " ran on "
                 << cpu::isa_name(cpu::isa_active()) << ")";
}

}  // namespace
}  // namespace kvscope
