// skip_reason.h — the reasons a test may skip on CI, as the opening words of its
// GTEST_SKIP message. scripts/check_skips.py reads ctest's log and accepts a skip only when
// its message opens with one of these tags; any other skip (no OpenGL, no model, no long
// text) fails the CI stage and is named there.
//
//   "[allowed: no-gpu]"      a test of the real CUDA device where no GPU is usable (its code
//                            also runs on the CUDA emulator, which every CI machine has);
//   "[allowed: isa NAME]"    a SIMD path (avx2, avx512) this CPU cannot run; the summary then
//                            lists that path as not run here.
#pragma once

#include <string>

#include "engine/cpu/cpu_isa.h"

namespace kvscope::test {

inline constexpr const char* kSkipNoGpu = "[allowed: no-gpu] ";

// "[allowed: isa avx512] this CPU lacks avx512: its kernels did not run here".
inline std::string skip_isa_lacking(cpu::Isa isa) {
  const std::string name = cpu::isa_name(isa);
  return "[allowed: isa " + name + "] this CPU lacks " + name + ": its kernels did not run here";
}

}  // namespace kvscope::test
