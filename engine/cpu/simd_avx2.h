// simd_avx2.h — 8-lane fp32 vector primitives for the AVX2 + FMA + F16C kernels.
//
// Included only by engine/cpu/kernels_avx2.cpp, after its target pragma. Same interface
// as simd_avx512.h (see there); a 16-row group is two vectors.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvscope::cpu {
namespace {

struct VecAvx2 {
  using F = __m256;   // 8 fp32 lanes
  using I = __m256i;  // 8 int32 lanes
  static constexpr int N = 8;
  static constexpr int kTileG = 1, kTileT = 6;
  static constexpr int kGemvG = 2;

  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, F v, int n) {
    const I lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes), v);
  }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F neg(F a) { return _mm256_sub_ps(_mm256_setzero_ps(), a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }

  static I u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I i8(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I and_(I a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I srl(I a, unsigned s) { return _mm256_srli_epi32(a, int(s)); }
  static I sub_i(I a, int v) { return _mm256_sub_epi32(a, _mm256_set1_epi32(v)); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static I bit4(uint32_t h, int first) {
    const I bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const I set =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(h >> first)), bit), bit);
    return and_(set, 16);
  }

  static F f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static F f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F bf16(const uint8_t* p) {
    const I w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};

}  // namespace
}  // namespace kvscope::cpu
