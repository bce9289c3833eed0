// kernels_scalar.cpp — the CPU kernels built for portable C++.
//
// Compiled with the build's own flags (no -m options of its own): the path for a CPU
// without AVX2, and the one KVSCOPE_CPU_ISA=scalar forces.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/cpu/kernels.h"
#include "engine/cpu/packed_weight.h"
#include "engine/quant.h"

#include "engine/cpu/act_impl.h"
#include "engine/cpu/attention_impl.h"
#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/rows_impl.h"
#include "engine/cpu/simd_scalar.h"

namespace kvscope::cpu {

const IsaKernels& kernels_scalar() {
  using K = Kernels<VecScalar>;
  using A = AttnKernels<VecScalar>;
  using R = RowKernels<VecScalar>;
  static const IsaKernels k{.isa = Isa::Scalar,
                            .matmul_groups = &K::matmul_groups,
                            .tile_t = VecScalar::kTileT,
                            .transpose_x = &K::transpose_x,
                            .attn_chunk = &A::attn_chunk,
                            .attn_combine = &A::attn_combine,
                            .silu_glu = &ActKernels<VecScalar>::silu_glu,
                            .f16_to_f32 = &R::f16_to_f32,
                            .f32_to_f16 = &R::f32_to_f16,
                            .dequantize_row = &R::dequantize_row,
                            .dot_f32 = &R::dot_f32,
                            .vec_dot = &R::vec_dot};
  return k;
}

}  // namespace kvscope::cpu
