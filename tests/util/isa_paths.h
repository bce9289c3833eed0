// isa_paths.h — a test fixture run once per SIMD path of the CPU backend (scalar, avx2,
// avx512; engine/cpu/cpu_isa.h). Each path is its own test case, named by a suffix
// (".../avx512"): a path this CPU lacks is a GoogleTest skip that names it
// (tests/util/skip_reason.h), never a quiet pass, so CI says which paths ran.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/cpu/cpu_isa.h"
#include "tests/util/skip_reason.h"

namespace kvscope::test {

class IsaPathTest : public ::testing::TestWithParam<cpu::Isa> {
 protected:
  void SetUp() override {
    if (!cpu::set_isa(GetParam())) GTEST_SKIP() << skip_isa_lacking(GetParam());
  }
  // Back to the path chosen at start-up.
  void TearDown() override { cpu::set_isa(saved_); }
  cpu::Isa isa() const { return GetParam(); }

 private:
  const cpu::Isa saved_ = cpu::isa_active();
};

// Whether the binary runs under a CPU emulator: KVSCOPE_TEST_EMULATED_CPU set (and not
// "0"), as scripts/test.sh sets it for its run under qemu-x86_64 -cpu Haswell, where an
// instruction costs about a hundred times its native time. The per-path tests then take
// fewer and smaller shapes, still one of each kernel branch (gemv, slices, rows, panel,
// ring, window): that run looks for an instruction the emulated CPU lacks and for a path
// that differs there; the native run checks every shape.
inline bool emulated_cpu() {
  const char* e = std::getenv("KVSCOPE_TEST_EMULATED_CPU");
  return e != nullptr && *e != '\0' && std::strcmp(e, "0") != 0;
}

// A float's bits: the per-path tests compare results bit for bit.
inline uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline std::string isa_param_name(const ::testing::TestParamInfo<cpu::Isa>& info) {
  return cpu::isa_name(info.param);
}

}  // namespace kvscope::test

// One test case per path for every TEST_P of FIXTURE (a subclass of IsaPathTest).
#define KVSCOPE_TEST_EVERY_ISA(FIXTURE)                                         \
  INSTANTIATE_TEST_SUITE_P(                                                     \
      Isa, FIXTURE,                                                             \
      ::testing::Values(::kvscope::cpu::Isa::Scalar, ::kvscope::cpu::Isa::Avx2, \
                        ::kvscope::cpu::Isa::Avx512),                           \
      ::kvscope::test::isa_param_name)
