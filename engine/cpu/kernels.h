// kernels.h — the CPU kernels of one instruction set, as a table of entry points.
//
// engine/cpu/kernels_{avx512,avx2,scalar}.cpp each build the table from the generic
// kernels (kernels_impl.h) for their instruction set; kernels(isa) returns it. Callers
// pick the table once per operation with kernels(isa_active()).
#pragma once

#include <cstdint>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/packed_weight.h"

namespace kvscope::cpu {

struct IsaKernels {
  Isa isa;
  // Row groups [g0, g1) (16 rows each) of out [T][w.n_out] = x [T][w.n_in] · Wᵀ; see
  // kernels_impl.h for the fixed arithmetic.
  void (*matmul_groups)(const PackedWeight& w, int64_t g0, int64_t g1, const float* x, int64_t T,
                        float* out);
};

const IsaKernels& kernels_avx512();
const IsaKernels& kernels_avx2();
const IsaKernels& kernels_scalar();

inline const IsaKernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return kernels_avx512();
    case Isa::Avx2:
      return kernels_avx2();
    default:
      return kernels_scalar();
  }
}

}  // namespace kvscope::cpu
