// kernels_table.h — an instruction set's IsaKernels table, filled from the kernel templates
// (kernels_impl.h, attention_impl.h, act_impl.h, rows_impl.h) instantiated for its Vec type.
// Each kernels_<isa>.cpp includes it last, with the Vec header of its instruction set; the
// function has internal linkage like the kernels, so every file keeps its own copy and no
// object defines a symbol another could link to instead (see kernels_avx512.cpp).
#pragma once

#include "engine/cpu/act_impl.h"
#include "engine/cpu/attention_impl.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_impl.h"
#include "engine/cpu/rows_impl.h"

namespace kvscope::cpu {
namespace {

template <class V>
IsaKernels isa_kernels_table(Isa isa) {
  using K = Kernels<V>;
  using A = AttnKernels<V>;
  using R = RowKernels<V>;
  return IsaKernels{.isa = isa,
                    .matmul_groups = &K::matmul_groups,
                    .uses_panel = &K::uses_panel,
                    .uses_rows = &K::uses_rows,
                    .slice_t = K::kSliceT,
                    .interleave_x = &K::interleave_x,
                    .tile_t = V::kTileT,
                    .transpose_x = &K::transpose_x,
                    .attn_chunk = &A::attn_chunk,
                    .attn_combine = &A::attn_combine,
                    .silu_glu = &ActKernels<V>::silu_glu,
                    .f16_to_f32 = &R::f16_to_f32,
                    .f32_to_f16 = &R::f32_to_f16,
                    .dequantize_row = &R::dequantize_row,
                    .dot_f32 = &R::dot_f32,
                    .vec_dot = &R::vec_dot};
}

}  // namespace
}  // namespace kvscope::cpu
