// vec_math.h — exp on a vector interface V (simd_avx512.h, simd_avx2.h, simd_scalar.h).
//
// exp(x) = 2^n · e^r with n = round(x · log2 e) and r = x − n·ln 2 (|r| ≤ ln2 / 2, ln 2 split
// in two so the reduction is exact to fp32), e^r by its Taylor series to r^7 (truncation
// below 6e-9 relative, under half an fp32 ulp) in Horner form. Max error about 2 ulp.
// Inputs below −87.3 (including −inf) give exactly 0; inputs must stay below 88.7.
// Every lane and every instruction set computes the same operations (fused
// multiply-adds, round to nearest even), so a value's exp never depends on where it sits.
#pragma once

namespace kvscope::cpu {
namespace {

template <class V>
typename V::F vexp(typename V::F x) {
  using F = typename V::F;
  constexpr float kMin = -87.3f;
  const F xc = V::max(x, V::set1(kMin));
  const F n = V::round(V::mul(xc, V::set1(1.44269504088896341f)));  // log2(e)
  // ln 2 = 0.693359375 (9 significant bits: n times it is exact) − 2.12194440054690583e-4.
  F r = V::fma(n, V::set1(-0.693359375f), xc);
  r = V::fma(n, V::set1(2.12194440054690583e-4f), r);
  F p = V::set1(1.0f / 5040);
  p = V::fma(p, r, V::set1(1.0f / 720));
  p = V::fma(p, r, V::set1(1.0f / 120));
  p = V::fma(p, r, V::set1(1.0f / 24));
  p = V::fma(p, r, V::set1(1.0f / 6));
  p = V::fma(p, r, V::set1(0.5f));
  p = V::fma(p, r, V::set1(1.0f));
  p = V::fma(p, r, V::set1(1.0f));
  return V::zero_below(x, kMin, V::mul(p, V::pow2(V::to_int(n))));
}

}  // namespace
}  // namespace kvscope::cpu
