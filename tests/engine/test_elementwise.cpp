// test_elementwise.cpp — the CPU backend's gated SiLU and RoPE as the forward pass calls
// them (Backend::glu, Backend::rope):
// - SiLU·up on every dispatch path (AVX-512, AVX2, scalar; forced with set_isa) against
//   float64, over gates from −200 to 200 (past where exp over- or underflows in fp32),
//   on row lengths that leave tails of every size (1, 3, 17, 64, 513); and the same bits
//   on every path and at every place in a row, so a token's activations do not depend on
//   the batch it runs in (KV CACHE and NO CACHE stay identical).
// - RoPE from the backend's table of angles equals rope_rows (angles worked out per call)
//   bit for bit, for both pair layouts, two bases used in turn, positions far apart, and
//   positions past the table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/elementwise.h"
#include "tests/util/isa_paths.h"

namespace kvscope {
namespace {

using cpu::Isa;

class Elementwise : public ::testing::Test {
 protected:
  void TearDown() override { cpu::set_isa(saved_); }
  const Isa saved_ = cpu::isa_active();
};

// T rows of n gates: random in [−12, 12] (where SiLU bends) with extremes mixed in.
std::vector<float> gates(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  const float extremes[] = {0.0f,  -0.0f,  1.0f,  -1.0f,  30.0f,  -30.0f,  87.0f,  -87.0f,
                            88.5f, -88.5f, 89.0f, -89.0f, 103.0f, -103.0f, 200.0f, -200.0f};
  std::vector<float> g(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) g[size_t(i)] = i % 7 == 3 ? extremes[(i / 7) % 16] : u(rng);
  return g;
}

std::vector<float> run_glu(int64_t T, int64_t n, const std::vector<float>& g,
                           const std::vector<float>& up) {
  auto be = make_cpu_backend(2);
  auto gt = be->scratch(0, T, n), ut = be->scratch(1, T, n);
  EXPECT_TRUE(gt.ok() && ut.ok());
  std::copy(g.begin(), g.end(), gt->data);
  std::copy(up.begin(), up.end(), ut->data);
  EXPECT_TRUE(be->glu(*gt, *ut, FfnAct::Silu, *gt).ok());  // in place, as the forward pass does
  return std::vector<float>(gt->data, gt->data + T * n);
}

using test::bits;

// The tests of one SIMD path, run once per path (".../scalar", ".../avx2", ".../avx512");
// a path this CPU lacks is reported as skipped (tests/util/isa_paths.h).
class ElementwisePath : public test::IsaPathTest {};
KVSCOPE_TEST_EVERY_ISA(ElementwisePath);

// Against float64, and the same bits as the scalar path (which every CPU runs).
TEST_P(ElementwisePath, SiluGluMatchesFloat64AndTheScalarPathsBits) {
  const Isa isa = this->isa();
  for (int64_t T : {1, 3})
    for (int64_t n : {1, 3, 17, 64, 513, 1536}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " T=" + std::to_string(T) +
                   " n=" + std::to_string(n));
      const std::vector<float> g = gates(T * n, uint32_t(n)), up = gates(T * n, uint32_t(n + 1));
      ASSERT_TRUE(cpu::set_isa(Isa::Scalar));
      const std::vector<float> scalar = run_glu(T, n, g, up);
      ASSERT_TRUE(cpu::set_isa(isa));
      const std::vector<float> got = run_glu(T, n, g, up);
      for (int64_t i = 0; i < T * n; ++i) {
        const double x = g[size_t(i)];
        const double want = x / (1.0 + std::exp(-x)) * double(up[size_t(i)]);
        ASSERT_NEAR(got[size_t(i)], want, 8e-7 * std::fabs(want) + 1e-30)
            << "gate " << x << " up " << up[size_t(i)];
        ASSERT_EQ(bits(got[size_t(i)]), bits(scalar[size_t(i)]))
            << "element " << i << " differs from the scalar path's";
      }
    }
}

TEST_P(ElementwisePath, SiluGluGivesAValueTheSameBitsWhereverItSitsInARow) {
  // One gate put at every place of a 35-value row (two 16-lane vectors and a tail of 3,
  // or four 8-lane vectors and a tail of 3): the same bits everywhere.
  const Isa isa = this->isa();
  for (float x : {-9.7f, -0.3f, 0.61f, 5.5f, -88.7f}) {
    SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " gate " + std::to_string(x));
    uint32_t seen = 0;
    for (int at = 0; at < 35; ++at) {
      std::vector<float> g(35, 1.0f), up(35, 1.5f);
      g[size_t(at)] = x;
      const uint32_t b = bits(run_glu(1, 35, g, up)[size_t(at)]);
      if (at == 0) seen = b;
      ASSERT_EQ(b, seen) << "at " << at;
    }
  }
}

TEST_F(Elementwise, RopeFromTheTableEqualsRopeRowsBitForBit) {
  auto be = make_cpu_backend(2);
  const int heads = 3, D = 64;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  struct Call {
    RopeSpec rope;
    int pos0, T;
  };
  const RopeSpec neox{RopeStyle::NeoX, 64, 10000.0f, 1.0f};
  const RopeSpec adj{RopeStyle::Adjacent, 48, 1e6f, 0.25f};
  // Prefill, decode steps, a second base in between, a jump far ahead, positions past
  // the table, and a negative start (not tabled either).
  const Call calls[] = {{neox, 0, 40},   {adj, 0, 40},
                        {neox, 40, 1},   {adj, 40, 1},
                        {neox, 41, 300}, {neox, 9000, 2},
                        {adj, 5, 3},     {neox, int(cpu::RopeTable::kMaxPositions) - 1, 2},
                        {adj, -3, 5}};
  for (const Call& c : calls) {
    SCOPED_TRACE("pos0 " + std::to_string(c.pos0) + " T " + std::to_string(c.T) + " n_rot " +
                 std::to_string(c.rope.n_rot));
    auto x = be->scratch(0, c.T, heads * D);
    ASSERT_TRUE(x.ok());
    std::vector<float> want(size_t(c.T) * heads * D);
    for (float& v : want) v = u(rng);
    std::copy(want.begin(), want.end(), x->data);
    ASSERT_TRUE(be->rope(*x, heads, D, c.rope, c.pos0).ok());
    cpu::rope_rows(want.data(), c.T, heads, D, c.rope.style, c.rope.n_rot, c.rope.base,
                   c.rope.freq_scale, c.pos0);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(bits(x->data[i]), bits(want[i])) << "value " << i;
  }
}

}  // namespace
}  // namespace kvscope
