// kernels_avx2.cpp — the CPU kernels built for AVX2 + FMA + F16C.
//
// engine/CMakeLists.txt compiles this file alone with the instruction set's flags
// (-mavx2 -mfma -mf16c, and -mno-avx512f so that a -march=native build on an AVX-512
// machine still tests the AVX2 code); nothing else in the engine is, and cpu_isa.cpp
// calls in here only when the CPU has them. So the code here must not define anything
// another file could link to instead of its own copy: the kernels have internal linkage,
// and the file instantiates no library function out of line (scripts/check_scalar_isa.sh
// checks the object's symbols).
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

#include "engine/cpu/act_impl.h"
#include "engine/cpu/attention_impl.h"
#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/rows_impl.h"
#include "engine/cpu/simd_avx2.h"

namespace kvscope::cpu {

const IsaKernels& kernels_avx2() {
  using K = Kernels<VecAvx2>;
  using A = AttnKernels<VecAvx2>;
  using R = RowKernels<VecAvx2>;
  static const IsaKernels k{.isa = Isa::Avx2,
                            .matmul_groups = &K::matmul_groups,
                            .tile_t = VecAvx2::kTileT,
                            .transpose_x = &K::transpose_x,
                            .attn_chunk = &A::attn_chunk,
                            .attn_combine = &A::attn_combine,
                            .silu_glu = &ActKernels<VecAvx2>::silu_glu,
                            .f16_to_f32 = &R::f16_to_f32,
                            .f32_to_f16 = &R::f32_to_f16,
                            .dequantize_row = &R::dequantize_row,
                            .dot_f32 = &R::dot_f32,
                            .vec_dot = &R::vec_dot};
  return k;
}

}  // namespace kvscope::cpu
