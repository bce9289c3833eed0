// kernels_scalar.cpp — the CPU kernels built for portable C++.
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

#include "engine/cpu/kernels.h"
#include "engine/cpu/packed_weight.h"
#include "engine/quant.h"

#pragma GCC push_options

#include "engine/cpu/act_impl.h"
#include "engine/cpu/attention_impl.h"
#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/simd_scalar.h"

namespace kvscope::cpu {

const IsaKernels& kernels_scalar() {
  static const IsaKernels k{Isa::Scalar, &Kernels<VecScalar>::matmul_groups,
                            VecScalar::kTileT, &Kernels<VecScalar>::transpose_x,
                            &AttnKernels<VecScalar>::attn_chunk,
                            &AttnKernels<VecScalar>::attn_combine,
                            &ActKernels<VecScalar>::silu_glu};
  return k;
}

}  // namespace kvscope::cpu

#pragma GCC pop_options
