// simd_avx512.h — 16-lane fp32 vector primitives for the AVX-512 kernels.
//
// Included only by engine/cpu/kernels_avx512.cpp, after its target pragma. The generic
// kernels (engine/cpu/kernels_impl.h) are written against this interface, which the
// AVX2 (simd_avx2.h) and scalar (simd_scalar.h) paths provide too. One lane holds one
// weight row of a 16-row group, so a group is 16 / N vectors.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvscope::cpu {
namespace {

struct VecAvx512 {
  using F = __m512;   // 16 fp32 lanes
  using I = __m512i;  // 16 int32 lanes
  static constexpr int N = 16;
  // Register tile of the batched product: kTileG groups of 16 rows × kTileT tokens.
  static constexpr int kTileG = 2, kTileT = 12;
  // Groups decoded together by the single-token (decode) kernel: independent chains.
  static constexpr int kGemvG = 4;

  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }

  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  // The first n (0 < n < N) lanes only.
  static void store_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F neg(F a) { return _mm512_sub_ps(_mm512_setzero_ps(), a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c, one rounding

  // N bytes widened to int32: zero- or sign-extended.
  static I u8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I i8(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I and_(I a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I srl(I a, unsigned s) { return _mm512_srli_epi32(a, s); }
  static I sub_i(I a, int v) { return _mm512_sub_epi32(a, _mm512_set1_epi32(v)); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  // Lane i = 16 where bit (first + i) of h is set, else 0 (a Q5 value's fifth bit).
  static I bit4(uint32_t h, int first) {
    return _mm512_maskz_set1_epi32(__mmask16(h >> first), 16);
  }

  // N fp32 / binary16 / bfloat16 values at p as fp32.
  static F f32(const uint8_t* p) { return _mm512_loadu_ps(reinterpret_cast<const float*>(p)); }
  static F f16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F bf16(const uint8_t* p) {
    const I w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
};

}  // namespace
}  // namespace kvscope::cpu
