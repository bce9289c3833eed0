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

#include "engine/cpu/simd_scalar.h"

#include "engine/cpu/kernels_table.h"

namespace kvscope::cpu {

const IsaKernels& kernels_scalar() {
  static const IsaKernels k = isa_kernels_table<VecScalar>(Isa::Scalar);
  return k;
}

}  // namespace kvscope::cpu
