// simd_avx2.h — 8-lane fp32 vector primitives for the AVX2 + FMA + F16C kernels.
//
// Included only by engine/cpu/kernels_avx2.cpp, the one file built with these instructions
// (engine/CMakeLists.txt). Same interface as simd_avx512.h (see there); a 16-row group is
// two vectors.
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
  // Groups of the single-token kernel: 4 × 2 vectors = 8 accumulator chains, which with the
  // scales kept in memory (kernels_impl.h) still fit the sixteen registers.
  static constexpr int kGemvG = 4;

  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, F v, int n) {
    const I lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes), v);
  }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F neg(F a) { return _mm256_sub_ps(_mm256_setzero_ps(), a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }

  static I u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I i8(const uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I u32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I and_(I a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I srl(I a, unsigned s) { return _mm256_srli_epi32(a, int(s)); }
  static I sub_i(I a, int v) { return _mm256_sub_epi32(a, _mm256_set1_epi32(v)); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }

  // Rows t < 4 of x (row t at x + t·ld), values [0, 4), to dst[i·4 + t]: the interleaved x
  // of the rows kernel (kernels_impl.h, interleave_x), a 4 × 4 transpose.
  static constexpr int kTransposeT = 4;
  // For nseg segments of the transposed x (segment i at src + i · 128: 32 values of 4
  // rows), out[i · 4 + t] = row t's 32 values added in order from 0 (four segments' chains
  // side by side): segment_sums' sums, bit for bit.
  static void transposed_sums(const float* src, int64_t nseg, float* out) {
    int64_t i = 0;
    for (; i + 4 <= nseg; i += 4) {
      __m128 a[4];
      for (int b = 0; b < 4; ++b) a[b] = _mm_setzero_ps();
      for (int j = 0; j < 32; ++j)
        for (int b = 0; b < 4; ++b)
          a[b] = _mm_add_ps(a[b], _mm_loadu_ps(src + ((i + b) * 32 + j) * 4));
      for (int b = 0; b < 4; ++b) _mm_storeu_ps(out + (i + b) * 4, a[b]);
    }
    for (; i < nseg; ++i) {
      __m128 a = _mm_setzero_ps();
      for (int j = 0; j < 32; ++j) a = _mm_add_ps(a, _mm_loadu_ps(src + (i * 32 + j) * 4));
      _mm_storeu_ps(out + i * 4, a);
    }
  }
  static void transpose(const float* x, int64_t ld, float* dst) {
    __m128 r0 = _mm_loadu_ps(x), r1 = _mm_loadu_ps(x + ld), r2 = _mm_loadu_ps(x + 2 * ld),
           r3 = _mm_loadu_ps(x + 3 * ld);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + 4, r1);
    _mm_storeu_ps(dst + 8, r2);
    _mm_storeu_ps(dst + 12, r3);
  }
  static I bit4(uint32_t h, int first) {
    const I bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const I set =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(h >> first)), bit), bit);
    return and_(set, 16);
  }

  static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static I to_int(F a) { return _mm256_cvtps_epi32(a); }
  static F pow2(I n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  }
  static F zero_below(F x, float t, F v) {
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(t), _CMP_GE_OQ), v);
  }

  static F f32(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static F f16(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F bf16(const uint8_t* p) {
    const I w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store_f16(uint8_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }

  // Lane i + lane i+4, then +2, +1.
  static float hsum(F v) {
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
  }
  static float hmax(F v) {
    const __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
  }
  // out[0..4) = hsum(a), hsum(b), hsum(c), hsum(d) with hsum's trees, four at a time.
  static void hsum4(F a, F b, F c, F d, float* out) {
    // +4: [a4 | b4] and [c4 | d4].
    const F ab =
        _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    const F cd =
        _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    // +2: [a0+a2, a1+a3, c0+c2, c1+c3 | b.., d..].
    const F s2 = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    // +1: [a, c, a, c | b, d, b, d].
    const F s1 = _mm256_add_ps(_mm256_shuffle_ps(s2, s2, 0x88), _mm256_shuffle_ps(s2, s2, 0xDD));
    _mm_storeu_ps(out, _mm_unpacklo_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1)));
  }
};

}  // namespace
}  // namespace kvscope::cpu
