// kernels_avx512.cpp — the CPU kernels built for AVX-512 (F, BW, VL, DQ).
//
// engine/CMakeLists.txt compiles this file alone with the instruction set's flags
// (-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c); nothing else in the
// engine is, and cpu_isa.cpp calls in here only when the CPU has them. So the code here
// must not define anything another file could link to instead of its own copy: the
// kernels have internal linkage, and the file instantiates no library function out of
// line (scripts/check_scalar_isa.sh checks the object's symbols).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include <immintrin.h>

#include "engine/cpu/kernels.h"
#include "engine/cpu/packed_weight.h"
#include "engine/quant.h"

// GCC 12's AVX-512 intrinsic headers self-initialise their "undefined" vectors, which
// -Wall reports as uninitialised use at every inlined call site; the values are unused.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "engine/cpu/simd_avx512.h"

#include "engine/cpu/kernels_table.h"

namespace kvscope::cpu {

const IsaKernels& kernels_avx512() {
  static const IsaKernels k = isa_kernels_table<VecAvx512>(Isa::Avx512);
  return k;
}

}  // namespace kvscope::cpu
