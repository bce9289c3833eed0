// kernels_avx2.cpp — the CPU kernels built for AVX2 + FMA + F16C.
//
// Standard headers come first, before the target pragma, so that only this file's own
// functions are compiled for the instruction set (see cpu_isa.h for the dispatch).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

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

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#include "engine/cpu/act_impl.h"
#include "engine/cpu/attention_impl.h"
#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/simd_avx2.h"

namespace kvscope::cpu {

const IsaKernels& kernels_avx2() {
  static const IsaKernels k{Isa::Avx2, &Kernels<VecAvx2>::matmul_groups,
                            VecAvx2::kTileT, &Kernels<VecAvx2>::transpose_x,
                            &AttnKernels<VecAvx2>::attn_chunk, &AttnKernels<VecAvx2>::attn_combine,
                            &ActKernels<VecAvx2>::silu_glu};
  return k;
}

}  // namespace kvscope::cpu

#pragma GCC pop_options
