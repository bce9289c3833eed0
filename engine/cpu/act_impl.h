// act_impl.h — the gated SiLU of the feed-forward block, written once against a vector
// interface V and compiled per instruction set by engine/cpu/kernels_{avx512,avx2,scalar}.cpp
// (internal linkage, like kernels_impl.h).
//
//   out[i] = (g / (1 + exp(−g))) · up[i],  g = gate[i]
//
// exp is vec_math.h's vexp, its argument capped at 88 (exp(88) ≈ 1.7e38 is finite, and g
// divided by it is 0 to within 1e-36, as the exact value is). A tail shorter than a
// vector goes through VecScalar, which computes the same operations as every lane: an
// element's result does not depend on where it sits, so CACHE and NO CACHE (different
// batch sizes) stay bit-identical.
#pragma once

#include <cstdint>

#include "engine/cpu/simd_scalar.h"
#include "engine/cpu/vec_math.h"

namespace kvscope::cpu {
namespace {

template <class V>
struct ActKernels {
  using F = typename V::F;
  static constexpr int N = V::N;

  template <class W>
  static typename W::F silu_times(typename W::F g, typename W::F up) {
    using G = typename W::F;
    const G e = vexp<W>(W::min(W::neg(g), W::set1(88.0f)));
    return W::mul(W::div(g, W::add(W::set1(1.0f), e)), up);
  }

  // out may alias gate.
  static void silu_glu(const float* gate, const float* up, int64_t n, float* out) {
    int64_t i = 0;
    for (; i + N <= n; i += N) V::store(out + i, silu_times<V>(V::load(gate + i), V::load(up + i)));
    for (; i < n; ++i) out[i] = silu_times<VecScalar>(gate[i], up[i]);
  }
};

}  // namespace
}  // namespace kvscope::cpu
