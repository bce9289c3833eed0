// attention_impl.h — one chunk of attention keys for one query and the G heads of one
// KV group, written once against a vector interface V and compiled per instruction set
// by engine/cpu/kernels_{avx512,avx2,scalar}.cpp (internal linkage, like kernels_impl.h).
//
// For up to kAttnChunk keys in ascending position order:
//   scores  s[g][j] = (scale·q_g) · k_j — each K row is read once, in its stored type,
//           and serves the G heads; the D products are summed in N-lane partial sums in
//           order of the dimension, then V::hsum's tree (four keys at a time, V::hsum4);
//   softmax m[g] = max_j s, e[g][j] = exp(s − m) (vec_math.h), sum[g] = Σ_j e in N-lane
//           partial sums then the tree;
//   values  acc[g] = Σ_j e[g][j] · v_j, keys in order, one fused multiply-add each; each V
//           row is read once for the G heads.
// Every step is fixed by the chunk's keys alone; attention.cpp combines chunks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "engine/cpu/kernels.h"
#include "engine/cpu/simd_scalar.h"
#include "engine/cpu/vec_math.h"

namespace kvscope::cpu {
namespace {

template <class V>
struct AttnKernels {
  using F = typename V::F;
  static constexpr int N = V::N;

  // Software prefetch: while key j is read, the rows of the key about kPrefetchBytes
  // further on are asked for. Each key's row sits at its own slot, so at long contexts
  // the hardware's stream prefetch alone leaves the loop waiting on memory (decode at
  // 2,048 positions read K/V at under half the machine's bandwidth without this). The
  // rows asked for may lie past the chunk, in the keys that follow (AttnChunk::n_after).
  static constexpr uint64_t kPrefetchBytes = 4096;
  static int ahead(uint64_t row_bytes) { return int((kPrefetchBytes + row_bytes - 1) / row_bytes); }
  static void prefetch(const uint8_t* base, uint64_t row_bytes, int32_t slot) {
    const uint8_t* p = base + uint64_t(slot) * row_bytes;
    for (uint64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
  }

  // Vector r (values r·N .. r·N + N) of a cached row of type T, decoded from its stored
  // form: the same values dequantize_row gives for q8_0 / q4_0 (32-value blocks along D).
  template <KvDtype T>
  static F row_vec(const uint8_t* p, int r) {
    if constexpr (T == KvDtype::F16) {
      return V::f16(p + 2 * r * N);
    } else if constexpr (T == KvDtype::Q8_0) {
      const uint8_t* b = p + 34 * (r * N / 32);
      return V::mul(V::cvt(V::i8(b + 2 + r * N % 32)), V::set1(V::half(b)));
    } else if constexpr (T == KvDtype::Q4_0) {
      const uint8_t* b = p + 18 * (r * N / 32);
      const int o = r * N % 32;
      const auto q = o < 16 ? V::and_(V::u8(b + 2 + o), 15) : V::srl(V::u8(b + 2 + o - 16), 4);
      return V::mul(V::cvt(V::sub_i(q, 8)), V::set1(V::half(b)));
    } else {
      return V::f32(p + 4 * r * N);
    }
  }
  static F row_vec(KvDtype t, const uint8_t* p, int r) {
    switch (t) {
      case KvDtype::F16:
        return row_vec<KvDtype::F16>(p, r);
      case KvDtype::Q8_0:
        return row_vec<KvDtype::Q8_0>(p, r);
      case KvDtype::Q4_0:
        return row_vec<KvDtype::Q4_0>(p, r);
      default:
        return row_vec<KvDtype::F32>(p, r);
    }
  }

  // Scores for the chunk into e[g][j], four keys at a time: q (already scaled, see
  // attention.cpp) held in registers, each K row converted once for the G heads.
  template <int RV, int G, KvDtype KT>
  static void scores(const AttnChunk& a) {
    constexpr int D = RV * N;
    F q[G][RV];
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < RV; ++r) q[g][r] = V::load(a.q + g * D + r * N);
    const int k_ahead = ahead(a.k_row_bytes), k_end = a.n + a.n_after;
    for (int j = 0; j < a.n; j += 4) {
      for (int u = j + k_ahead; u < std::min(j + k_ahead + 4, k_end); ++u)
        prefetch(a.k_base, a.k_row_bytes, a.slots[u]);
      const int nk = std::min(4, a.n - j);
      const uint8_t* k[4];
      k[0] = a.k_base + uint64_t(a.slots[j]) * a.k_row_bytes;
      k[1] = nk > 1 ? a.k_base + uint64_t(a.slots[j + 1]) * a.k_row_bytes : k[0];
      k[2] = nk > 2 ? a.k_base + uint64_t(a.slots[j + 2]) * a.k_row_bytes : k[0];
      k[3] = nk > 3 ? a.k_base + uint64_t(a.slots[j + 3]) * a.k_row_bytes : k[0];
      F s[G][4];
      {
        F kr[4];
        for (int u = 0; u < 4; ++u) kr[u] = row_vec<KT>(k[u], 0);
        for (int g = 0; g < G; ++g)
          for (int u = 0; u < 4; ++u) s[g][u] = V::mul(q[g][0], kr[u]);
      }
      for (int r = 1; r < RV; ++r) {
        F kr[4];
        for (int u = 0; u < 4; ++u) kr[u] = row_vec<KT>(k[u], r);
        for (int g = 0; g < G; ++g)
          for (int u = 0; u < 4; ++u) s[g][u] = V::fma(q[g][r], kr[u], s[g][u]);
      }
      // Four sums at once, straight into the row (j + 4 <= kAttnChunk: the lanes past n
      // are overwritten by softmax_row).
      for (int g = 0; g < G; ++g)
        V::hsum4(s[g][0], s[g][1], s[g][2], s[g][3], a.e + g * kAttnChunk + j);
    }
  }

  // Turns row g's scores into exp(s − max), 0 past n; fills m[g] and sum[g].
  static void softmax_row(const AttnChunk& a, int g) {
    float* row = a.e + g * kAttnChunk;
    const int nv = (a.n + N - 1) / N * N;
    for (int j = a.n; j < nv; ++j) row[j] = -INFINITY;
    F mx = V::set1(-INFINITY);
    for (int j = 0; j < nv; j += N) mx = V::max(mx, V::load(row + j));
    const float m = V::hmax(mx);
    F sum = V::zero();
    for (int j = 0; j < nv; j += N) {
      const F e = vexp<V>(V::sub(V::load(row + j), V::set1(m)));
      V::store(row + j, e);
      sum = V::add(sum, e);
    }
    a.m[g] = m;
    a.sum[g] = V::hsum(sum);
  }

  template <int RV, int G, KvDtype VT>
  static void values(const AttnChunk& a) {
    constexpr int D = RV * N;
    F acc[G][RV];
    const int v_ahead = ahead(a.v_row_bytes), v_end = a.n + a.n_after;
    for (int j = 0; j < a.n; ++j) {
      if (j + v_ahead < v_end) prefetch(a.v_base, a.v_row_bytes, a.slots[j + v_ahead]);
      const uint8_t* v = a.v_base + uint64_t(a.slots[j]) * a.v_row_bytes;
      F vr[RV];
      for (int r = 0; r < RV; ++r) vr[r] = row_vec<VT>(v, r);
      for (int g = 0; g < G; ++g) {
        const F w = V::bcast(a.e + g * kAttnChunk + j);
        if (j == 0) {
          for (int r = 0; r < RV; ++r) acc[g][r] = V::mul(w, vr[r]);
        } else {
          for (int r = 0; r < RV; ++r) acc[g][r] = V::fma(w, vr[r], acc[g][r]);
        }
      }
    }
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < RV; ++r) V::store(a.acc + g * D + r * N, acc[g][r]);
  }

  template <int RV, int G>
  static void chunk(const AttnChunk& a) {
    switch (a.k_type) {
      case KvDtype::F16:
        scores<RV, G, KvDtype::F16>(a);
        break;
      case KvDtype::Q8_0:
        scores<RV, G, KvDtype::Q8_0>(a);
        break;
      case KvDtype::Q4_0:
        scores<RV, G, KvDtype::Q4_0>(a);
        break;
      default:
        scores<RV, G, KvDtype::F32>(a);
        break;
    }
    for (int g = 0; g < G; ++g) softmax_row(a, g);
    switch (a.v_type) {
      case KvDtype::F16:
        values<RV, G, KvDtype::F16>(a);
        break;
      case KvDtype::Q8_0:
        values<RV, G, KvDtype::Q8_0>(a);
        break;
      case KvDtype::Q4_0:
        values<RV, G, KvDtype::Q4_0>(a);
        break;
      default:
        values<RV, G, KvDtype::F32>(a);
        break;
    }
  }

  // Any G: the same arithmetic one head at a time (the K and V rows are then read once
  // per head).
  template <int RV>
  static void chunk_heads(const AttnChunk& a) {
    for (int g = 0; g < a.G; ++g) {
      AttnChunk one = a;
      one.q = a.q + g * a.D;
      one.e = a.e + g * kAttnChunk;
      one.m = a.m + g;
      one.sum = a.sum + g;
      one.acc = a.acc + g * a.D;
      one.G = 1;
      chunk<RV, 1>(one);
    }
  }

  template <int RV>
  static void chunk_rv(const AttnChunk& a) {
    switch (a.G) {
      case 1:
        chunk<RV, 1>(a);
        return;
      case 2:
        chunk<RV, 2>(a);
        return;
      case 3:
        chunk<RV, 3>(a);
        return;
      case 4:
        chunk<RV, 4>(a);
        return;
      case 5:
        chunk<RV, 5>(a);
        return;
      case 6:
        chunk<RV, 6>(a);
        return;
      case 7:
        chunk<RV, 7>(a);
        return;
      case 8:
        chunk<RV, 8>(a);
        return;
      default:
        chunk_heads<RV>(a);
        return;
    }
  }

  // The chunk weights f_c = exp(m_c − m) are scalars (vexp on one lane); the D-long sums
  // are vectors.
  static void attn_combine(const AttnCombine& a) {
    const int G = a.G, D = a.D;
    for (int g = 0; g < G; ++g) {
      auto part = [&](int c) { return a.parts + size_t(c) * a.stride; };
      float m = -INFINITY;
      for (int c = 0; c < a.n_chunks; ++c) m = std::max(m, part(c)[G * kAttnChunk + g]);
      float* out = a.out + g * D;
      float sum = 0;
      for (int c = 0; c < a.n_chunks; ++c) {
        const float* p = part(c);
        const float f = vexp<VecScalar>(p[G * kAttnChunk + g] - m);
        sum = std::fma(p[G * kAttnChunk + G + g], f, sum);
        const float* acc = p + G * kAttnChunk + 2 * G + g * D;
        const F fv = V::set1(f);
        for (int d = 0; d < D; d += N)
          V::store(out + d, c == 0 ? V::mul(V::load(acc + d), fv)
                                   : V::fma(V::load(acc + d), fv, V::load(out + d)));
      }
      const float inv = 1.0f / sum;
      for (int d = 0; d < D; d += N) V::store(out + d, V::mul(V::load(out + d), V::set1(inv)));
      if (!a.probs) continue;
      float* row = a.probs + g * a.probs_cols;
      for (int c = 0; c < a.n_chunks; ++c) {
        const float* e = part(c) + g * kAttnChunk;
        const float w = vexp<VecScalar>(part(c)[G * kAttnChunk + g] - m) * inv;
        float* dst = row + a.chunk_begin[c];
        int j = 0;
        for (; j + N <= a.chunk_n[c]; j += N) V::store(dst + j, V::mul(V::load(e + j), V::set1(w)));
        for (; j < a.chunk_n[c]; ++j) dst[j] = e[j] * w;
      }
    }
  }

  // Head sizes: 64, 128 and 256 (and, on the scalar path, any other up to 256).
  static void attn_chunk(const AttnChunk& a) {
    if (a.D == 64) return chunk_rv<64 / N>(a);
    if (a.D == 128) return chunk_rv<128 / N>(a);
    if (a.D == 256) return chunk_rv<256 / N>(a);
    if constexpr (N == 1) chunk_odd(a);  // other head sizes: the scalar path only
  }

  // Scalar path, any D: the same steps with loops bounded at run time.
  static void chunk_odd(const AttnChunk& a) {
    for (int g = 0; g < a.G; ++g) {
      float* row = a.e + g * kAttnChunk;
      for (int j = 0; j < a.n; ++j) {
        const uint8_t* k = a.k_base + uint64_t(a.slots[j]) * a.k_row_bytes;
        F s = V::mul(V::load(a.q + g * a.D), row_vec(a.k_type, k, 0));
        for (int r = 1; r < a.D; ++r)
          s = V::fma(V::load(a.q + g * a.D + r), row_vec(a.k_type, k, r), s);
        row[j] = s;
      }
      softmax_row(a, g);
      float* acc = a.acc + g * a.D;
      for (int j = 0; j < a.n; ++j) {
        const uint8_t* v = a.v_base + uint64_t(a.slots[j]) * a.v_row_bytes;
        for (int r = 0; r < a.D; ++r)
          acc[r] = j == 0 ? row[j] * row_vec(a.v_type, v, r)
                          : V::fma(row[j], row_vec(a.v_type, v, r), acc[r]);
      }
    }
  }
};

}  // namespace
}  // namespace kvscope::cpu
