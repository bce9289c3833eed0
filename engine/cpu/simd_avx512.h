// simd_avx512.h — 16-lane fp32 vector primitives for the AVX-512 kernels.
//
// Included only by engine/cpu/kernels_avx512.cpp, the one file built with these
// instructions (engine/CMakeLists.txt). The generic kernels (engine/cpu/kernels_impl.h)
// are written against this interface, which the AVX2 (simd_avx2.h) and scalar
// (simd_scalar.h) paths provide too. One lane holds one weight row of a 16-row group, so a
// group is 16 / N vectors.
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
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F neg(F a) { return _mm512_sub_ps(_mm512_setzero_ps(), a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c, one rounding

  // N bytes widened to int32: zero- or sign-extended.
  static I u8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I i8(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I u32(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I and_(I a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I srl(I a, unsigned s) { return _mm512_srli_epi32(a, s); }
  static I sub_i(I a, int v) { return _mm512_sub_epi32(a, _mm512_set1_epi32(v)); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }

  // Rows t < 8 of x (row t at x + t·ld), values [0, 8), to dst[i·8 + t]: the interleaved x
  // of the rows kernel (kernels_impl.h, interleave_x), an 8 × 8 transpose.
  static constexpr int kTransposeT = 8;
  // For nseg segments of the transposed x (segment i at src + i · 256: 32 values of 8
  // rows), out[i · 8 + t] = row t's 32 values added in order from 0 (four segments' chains
  // side by side): segment_sums' sums, bit for bit.
  static void transposed_sums(const float* src, int64_t nseg, float* out) {
    int64_t i = 0;
    for (; i + 4 <= nseg; i += 4) {
      __m256 a[4];
      for (int b = 0; b < 4; ++b) a[b] = _mm256_setzero_ps();
      for (int j = 0; j < 32; ++j)
        for (int b = 0; b < 4; ++b)
          a[b] = _mm256_add_ps(a[b], _mm256_loadu_ps(src + ((i + b) * 32 + j) * 8));
      for (int b = 0; b < 4; ++b) _mm256_storeu_ps(out + (i + b) * 8, a[b]);
    }
    for (; i < nseg; ++i) {
      __m256 a = _mm256_setzero_ps();
      for (int j = 0; j < 32; ++j) a = _mm256_add_ps(a, _mm256_loadu_ps(src + (i * 32 + j) * 8));
      _mm256_storeu_ps(out + i * 8, a);
    }
  }
  static void transpose(const float* x, int64_t ld, float* dst) {
    __m256 r[8], u[8];
    for (int t = 0; t < 8; ++t) r[t] = _mm256_loadu_ps(x + t * ld);
    for (int t = 0; t < 8; t += 2) {
      u[t] = _mm256_unpacklo_ps(r[t], r[t + 1]);
      u[t + 1] = _mm256_unpackhi_ps(r[t], r[t + 1]);
    }
    for (int t = 0; t < 8; t += 4)
      for (int h = 0; h < 2; ++h) {
        r[t + 2 * h] = _mm256_shuffle_ps(u[t + h], u[t + 2 + h], _MM_SHUFFLE(1, 0, 1, 0));
        r[t + 2 * h + 1] = _mm256_shuffle_ps(u[t + h], u[t + 2 + h], _MM_SHUFFLE(3, 2, 3, 2));
      }
    for (int i = 0; i < 4; ++i) {
      _mm256_storeu_ps(dst + i * 8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
      _mm256_storeu_ps(dst + (i + 4) * 8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
  }
  // Lane i = table[a[i] & 15] (table: 16 fp32 lanes): one vpermps, which reads only the
  // low 4 bits of each index, widens and converts a 4-bit field at once (kernels_impl.h,
  // nibbles). AVX2's vpermps indexes 8 lanes, so the other paths have no lut16.
  static F lut16(I a, F table) { return _mm512_permutexvar_ps(a, table); }
  // Lane i = 16 where bit (first + i) of h is set, else 0 (a Q5 value's fifth bit).
  static I bit4(uint32_t h, int first) {
    return _mm512_maskz_set1_epi32(__mmask16(h >> first), 16);
  }

  // Nearest integer (ties to even), as a float; then as an int32 (exact).
  static F round(F a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static I to_int(F a) { return _mm512_cvtps_epi32(a); }
  // 2^n for integer n in [-126, 127].
  static F pow2(I n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  }
  // v where x >= t, else 0.
  static F zero_below(F x, float t, F v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(t), _CMP_GE_OQ), v);
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
  // N values as binary16 at p, rounded to nearest even.
  static void store_f16(uint8_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
  }

  // Sum of the lanes in a fixed tree: lane i + lane i+8, then +4, +2, +1.
  static float hsum(F v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
  }
  static float hmax(F v) { return _mm512_reduce_max_ps(v); }
  // out[0..4) = hsum(a), hsum(b), hsum(c), hsum(d): the same trees, four at a time.
  static void hsum4(F a, F b, F c, F d, float* out) {
    // +8: [a lanes 0-7 summed with 8-15 | b ...] and [c | d].
    const F ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const F cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    // +4: 128-bit lanes [a, b, c, d], four partial sums each.
    const F s4 =
        _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    // +2, then +1, within each 128-bit lane; the sum lands in its lane 0.
    const F s2 = _mm512_add_ps(s4, _mm512_permute_ps(s4, 0x4E));
    const F s1 = _mm512_add_ps(s2, _mm512_permute_ps(s2, 0xB1));
    const F packed = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s1);
    _mm_storeu_ps(out, _mm512_castps512_ps128(packed));
  }
};

}  // namespace
}  // namespace kvscope::cpu
