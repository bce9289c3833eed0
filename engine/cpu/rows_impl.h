// rows_impl.h — row conversions and dot products of the CPU backend, written once against
// a vector interface V (simd_avx512.h, simd_avx2.h, simd_scalar.h) and compiled per
// instruction set by engine/cpu/kernels_{avx512,avx2,scalar}.cpp (internal linkage, like
// kernels_impl.h). engine/quant.cpp is the plain scalar reference of the same operations.
//
//  - f16_to_f32 / f32_to_f16: binary16 rows to and from fp32 (the f16 KV cache rows). Both
//    are exact or round to nearest even, so every path gives the reference's bits.
//  - dequantize_row: a weight or q8_0 / q4_0 cache row to fp32. Each value is computed with
//    the reference's operations in the reference's order (d·q, d·q + m: one rounding per
//    operation, nothing fused), so every path gives the bits of kvscope::dequantize_row.
//    Q4_K, Q5_K and Q6_K go through the reference block by block.
//  - dot_f32 / vec_dot: Σ a_i·b_i with fused multiply-adds in two N-lane partial sums, then
//    V::hsum; paths sum in different orders and agree only to rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/cpu/simd_scalar.h"
#include "engine/gguf.h"
#include "engine/quant.h"

namespace kvscope::cpu {
namespace {

template <class V>
struct RowKernels {
  using F = typename V::F;
  static constexpr int N = V::N;
  static_assert(32 % N == 0, "a 32-value block is a whole number of vectors");

  static void f16_to_f32(const uint8_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + N <= n; i += N) V::store(dst + i, V::f16(src + 2 * i));
    for (; i < n; ++i) dst[i] = VecScalar::f16(src + 2 * i);
  }

  static void f32_to_f16(const float* src, uint8_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + N <= n; i += N) V::store_f16(dst + 2 * i, V::load(src + i));
    for (; i < n; ++i) VecScalar::store_f16(dst + 2 * i, src[i]);
  }

  static void bf16_to_f32(const uint8_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + N <= n; i += N) V::store(dst + i, V::bf16(src + 2 * i));
    for (; i < n; ++i) dst[i] = VecScalar::bf16(src + 2 * i);
  }

  // ---- one 32-value block into y[0..32) (ggml layouts, see engine/quant.cpp) ----

  static void deq_q8_0(const uint8_t* b, float* y) {
    const F d = V::set1(V::half(b));
    for (int r = 0; r < 32; r += N) V::store(y + r, V::mul(V::cvt(V::i8(b + 2 + r)), d));
  }

  // Q4: byte j holds value j (low nibble) and value j + 16 (high nibble).
  template <bool kMin>
  static void deq_q4(const uint8_t* b, float* y) {
    const F d = V::set1(V::half(b));
    const F m = kMin ? V::set1(V::half(b + 2)) : V::zero();
    const uint8_t* qs = b + (kMin ? 4 : 2);
    for (int r = 0; r < 16; r += N) {
      const auto u = V::u8(qs + r);
      if constexpr (kMin) {
        V::store(y + r, V::add(V::mul(V::cvt(V::and_(u, 15)), d), m));
        V::store(y + 16 + r, V::add(V::mul(V::cvt(V::srl(u, 4)), d), m));
      } else {
        V::store(y + r, V::mul(V::cvt(V::sub_i(V::and_(u, 15), 8)), d));
        V::store(y + 16 + r, V::mul(V::cvt(V::sub_i(V::srl(u, 4), 8)), d));
      }
    }
  }

  // Q5: Q4 nibbles plus a fifth bit per value from the 32-bit qh (bit j = value j).
  template <bool kMin>
  static void deq_q5(const uint8_t* b, float* y) {
    const F d = V::set1(V::half(b));
    const F m = kMin ? V::set1(V::half(b + 2)) : V::zero();
    uint32_t h;
    std::memcpy(&h, b + (kMin ? 4 : 2), 4);
    const uint8_t* qs = b + (kMin ? 8 : 6);
    for (int r = 0; r < 16; r += N) {
      const auto u = V::u8(qs + r);
      const auto lo = V::or_(V::and_(u, 15), V::bit4(h, r));
      const auto hi = V::or_(V::srl(u, 4), V::bit4(h, 16 + r));
      if constexpr (kMin) {
        V::store(y + r, V::add(V::mul(V::cvt(lo), d), m));
        V::store(y + 16 + r, V::add(V::mul(V::cvt(hi), d), m));
      } else {
        V::store(y + r, V::mul(V::cvt(V::sub_i(lo, 16)), d));
        V::store(y + 16 + r, V::mul(V::cvt(V::sub_i(hi, 16)), d));
      }
    }
  }

  using BlockDeq = void (*)(const uint8_t*, float*);
  static BlockDeq block_dequantizer(GgmlType t) {
    switch (t) {
      case GgmlType::Q8_0:
        return deq_q8_0;
      case GgmlType::Q4_0:
        return deq_q4<false>;
      case GgmlType::Q4_1:
        return deq_q4<true>;
      case GgmlType::Q5_0:
        return deq_q5<false>;
      case GgmlType::Q5_1:
        return deq_q5<true>;
      default:
        return nullptr;
    }
  }

  static void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(src);
    switch (t) {
      case GgmlType::F32:
        std::memcpy(dst, p, size_t(n) * 4);
        return;
      case GgmlType::F16:
        return f16_to_f32(p, dst, n);
      case GgmlType::BF16:
        return bf16_to_f32(p, dst, n);
      default:
        break;
    }
    const BlockDeq deq = block_dequantizer(t);
    if (!deq) return kvscope::dequantize_row(t, src, dst, n);  // K-quants, unsupported types
    const uint64_t bytes = type_traits(t)->type_size;
    for (int64_t i = 0, b = 0; i < n; i += 32, ++b) deq(p + uint64_t(b) * bytes, dst + i);
  }

  // Σ load(a, i)·b[i] in two N-lane partial sums (even / odd vectors), then the tree.
  template <class Load>
  static float dot(const uint8_t* a, const float* b, int64_t n) {
    F s0 = V::zero(), s1 = V::zero();
    int64_t i = 0;
    for (; i + 2 * N <= n; i += 2 * N) {
      s0 = V::fma(Load::template load<V>(a, i), V::load(b + i), s0);
      s1 = V::fma(Load::template load<V>(a, i + N), V::load(b + i + N), s1);
    }
    float s = V::hsum(V::add(s0, s1));
    for (; i < n; ++i) s = std::fma(Load::template load<VecScalar>(a, i), b[i], s);
    return s;
  }
  struct AtF32 {
    template <class W>
    static typename W::F load(const uint8_t* a, int64_t i) { return W::f32(a + 4 * i); }
  };
  struct AtF16 {
    template <class W>
    static typename W::F load(const uint8_t* a, int64_t i) { return W::f16(a + 2 * i); }
  };
  struct AtBF16 {
    template <class W>
    static typename W::F load(const uint8_t* a, int64_t i) { return W::bf16(a + 2 * i); }
  };

  static float dot_f32(const float* a, const float* b, int64_t n) {
    return dot<AtF32>(reinterpret_cast<const uint8_t*>(a), b, n);
  }

  // sum_i row[i]·x[i]: float rows directly, block types one block at a time through a
  // stack buffer (this path's dequantizer), blocks alternating between two partial sums.
  static float vec_dot(GgmlType t, const void* row, const float* x, int64_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(row);
    switch (t) {
      case GgmlType::F32:
        return dot<AtF32>(p, x, n);
      case GgmlType::F16:
        return dot<AtF16>(p, x, n);
      case GgmlType::BF16:
        return dot<AtBF16>(p, x, n);
      default:
        break;
    }
    const TypeTraits* tt = type_traits(t);
    if (!tt || !tt->supported) return 0.0f;  // callers check type_supported first
    const BlockDeq deq = block_dequantizer(t);
    const int64_t bs = tt->block_size;
    alignas(64) float buf[256];
    F s[2] = {V::zero(), V::zero()};
    for (int64_t i = 0, b = 0; i < n; i += bs, ++b) {
      const uint8_t* blk = p + uint64_t(b) * tt->type_size;
      if (deq) {
        deq(blk, buf);
      } else {
        kvscope::dequantize_row(t, blk, buf, bs);
      }
      F& acc = s[b & 1];
      for (int64_t r = 0; r < bs; r += N) acc = V::fma(V::load(buf + r), V::load(x + i + r), acc);
    }
    return V::hsum(V::add(s[0], s[1]));
  }
};

}  // namespace
}  // namespace kvscope::cpu
