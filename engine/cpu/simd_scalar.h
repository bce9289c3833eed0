// simd_scalar.h — one-lane "vector" primitives: the portable path of the CPU kernels.
//
// Included only by engine/cpu/kernels_scalar.cpp. Same interface as simd_avx512.h with
// N = 1, so the generic kernels (engine/cpu/kernels_impl.h) compile to plain C++. The
// multiply-add is std::fma, fused like the vector instructions, so this path computes
// bit for bit what the AVX2 and AVX-512 paths compute.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/quant.h"

namespace kvscope::cpu {
namespace {

struct VecScalar {
  using F = float;
  using I = int32_t;
  static constexpr int N = 1;
  static constexpr int kTileG = 1, kTileT = 2;
  static constexpr int kGemvG = 1;

  static F zero() { return 0.0f; }
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static void store_n(float* p, F v, int) { *p = v; }
  static F bcast(const float* p) { return *p; }
  static F set1(float v) { return v; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F max(F a, F b) { return a > b ? a : b; }
  static F min(F a, F b) { return a < b ? a : b; }
  static F div(F a, F b) { return a / b; }
  static F neg(F a) { return -a; }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }

  static I u8(const uint8_t* p) { return I(*p); }
  static I i8(const uint8_t* p) { return I(int8_t(*p)); }
  static I u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return I(v);
  }
  static I and_(I a, int m) { return a & m; }
  static I or_(I a, I b) { return a | b; }
  static I srl(I a, unsigned s) { return I(uint32_t(a) >> s); }
  static I sub_i(I a, int v) { return a - v; }
  static F cvt(I a) { return F(a); }
  static I bit4(uint32_t h, int first) { return I(((h >> first) & 1u) << 4); }

  static F round(F a) { return std::nearbyint(a); }
  static I to_int(F a) { return I(a); }
  static F pow2(I n) {
    const uint32_t bits = uint32_t(n + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static F zero_below(F x, float t, F v) { return x >= t ? v : 0.0f; }

  static uint16_t u16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
  }
  static F f32(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  static F f16(const uint8_t* p) { return fp16_to_fp32(u16(p)); }
  static F bf16(const uint8_t* p) { return bf16_to_fp32(u16(p)); }
  static float half(const uint8_t* p) { return f16(p); }
  // v as binary16 at p, rounded to nearest even.
  static void store_f16(uint8_t* p, F v) {
    const uint16_t h = fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
  }

  static float hsum(F v) { return v; }
  static float hmax(F v) { return v; }
  static void hsum4(F a, F b, F c, F d, float* out) {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
};

}  // namespace
}  // namespace kvscope::cpu
