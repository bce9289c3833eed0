// kernels_impl.h — CPU matrix products on packed quantized weights, written once against
// a vector interface V (simd_avx512.h, simd_avx2.h, simd_scalar.h) and compiled once per
// instruction set by engine/cpu/kernels_{avx512,avx2,scalar}.cpp. Everything here has
// internal linkage, so the copies built for different instruction sets never mix.
//
// out[t][o] = Σ_k W[o][k]·x[t][k], x [T][n] fp32, W packed (packed_weight.h): sixteen
// rows per group, one vector lane per row. The arithmetic of one output element is fixed
// — and therefore independent of T, of the thread split, of which kernel below runs and
// even of the instruction set:
//  - every weight value comes from the same decoder (Pack*<V>::seg / step below);
//  - the accumulator starts at 0 and adds W[o][k]·x[t][k] for k = 0, 1, 2, ... in
//    order, each with one fused multiply-add; nothing else touches it.
// Kernels:
//  - gemv (T ≤ kGemvMaxT, the decode step): each packed group is streamed once and decoded in
//    registers straight into the token accumulators, kGemvG groups at a time so that
//    their multiply-add chains overlap;
//  - gemv slices (kGemvMaxT < T <= kGemvSlicesMaxT, a batch of decode rows): gemv over
//    slices of 16 rows (AVX-512), 8, then 4 or fewer;
//  - panel (T > kGemvSlicesMaxT, prefill and NO CACHE): a few groups are decoded once into an fp32
//    panel [k][16] that stays in L2, then swept by register tiles of kTileG groups ×
//    kTileT tokens (x broadcast from its transposed copy, made once per product by
//    transpose_x), so every decoded value serves every token.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/cpu/packed_weight.h"

namespace kvscope::cpu {
namespace {

inline uint32_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Per-thread scratch of the panel kernel, zeroed when it grows. A type of this header's own
// (internal linkage) rather than std::vector: a library template instantiated here would
// be compiled with the including file's instruction-set flags, and the linker could pick
// that copy for the rest of the program too.
struct ScratchFloats {
  float* p = nullptr;
  size_t n = 0;
  ScratchFloats() = default;
  ScratchFloats(const ScratchFloats&) = delete;
  ScratchFloats& operator=(const ScratchFloats&) = delete;
  ~ScratchFloats() { std::free(p); }
  void reserve(size_t want) {
    if (want <= n) return;
    std::free(p);
    p = static_cast<float*>(std::calloc(want, sizeof(float)));
    if (!p) std::abort();  // out of memory
    n = want;
  }
  float* data() const { return p; }
};

// ---- decoders of one packed block (16 rows) ----
// A block of kValues k-values is kSegs segments of kSegValues; seg() loads a segment's
// scales, step(j) decodes k-values [j·kStep, (j+1)·kStep) of the segment into
// w[u][h] (value u of the step, lanes h·N .. h·N+N of the group). The offsets follow
// the layouts in packed_weight.h.

template <class V>
struct Lanes {
  static constexpr int H = 16 / V::N;  // vectors per 16-row group
  using F = typename V::F;
};

template <class V, int E, class Load>
struct PackFloat : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr int kValues = 1, kSegs = 1, kSegValues = 1, kStep = 1;
  struct Seg {};
  static Seg seg(const uint8_t*, int) { return {}; }
  static void step(const uint8_t* b, const Seg&, int, int, F (&w)[1][H]) {
    for (int h = 0; h < H; ++h) w[0][h] = Load::load(b + E * h * V::N);
  }
};
template <class V>
struct LoadF32 {
  static typename V::F load(const uint8_t* p) { return V::f32(p); }
};
template <class V>
struct LoadF16 {
  static typename V::F load(const uint8_t* p) { return V::f16(p); }
};
template <class V>
struct LoadBF16 {
  static typename V::F load(const uint8_t* p) { return V::bf16(p); }
};

// d[16] f16 at b: one vector per half.
template <class V>
struct Scale1 {
  typename V::F d[Lanes<V>::H];
  static Scale1 at(const uint8_t* b) {
    Scale1 s;
    for (int h = 0; h < Lanes<V>::H; ++h) s.d[h] = V::f16(b + 2 * h * V::N);
    return s;
  }
};
// d[16], m[16] f16 at b.
template <class V>
struct Scale2 {
  typename V::F d[Lanes<V>::H], m[Lanes<V>::H];
  static Scale2 at(const uint8_t* b) {
    Scale2 s;
    for (int h = 0; h < Lanes<V>::H; ++h) {
      s.d[h] = V::f16(b + 2 * h * V::N);
      s.m[h] = V::f16(b + 32 + 2 * h * V::N);
    }
    return s;
  }
};

template <class V>
struct PackQ8_0 : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32, kStep = 1;
  using Seg = Scale1<V>;
  static Seg seg(const uint8_t* b, int) { return Seg::at(b); }
  static void step(const uint8_t* b, const Seg& s, int, int j, F (&w)[1][H]) {
    const uint8_t* q = b + 32 + 16 * j;
    for (int h = 0; h < H; ++h) w[0][h] = V::mul(V::cvt(V::i8(q + h * V::N)), s.d[h]);
  }
};

// Q4_0 / Q4_1: a step is one byte per row: value 2j in the low nibble, 2j+1 in the high.
template <class V, bool kMin>
struct PackQ4 : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32, kStep = 2;
  using Seg = std::conditional_t<kMin, Scale2<V>, Scale1<V>>;
  static Seg seg(const uint8_t* b, int) { return Seg::at(b); }
  static void step(const uint8_t* b, const Seg& s, int, int j, F (&w)[2][H]) {
    const uint8_t* q = b + (kMin ? 64 : 32) + 16 * j;
    for (int h = 0; h < H; ++h) {
      const auto u = V::u8(q + h * V::N);
      if constexpr (kMin) {
        w[0][h] = V::fma(V::cvt(V::and_(u, 15)), s.d[h], s.m[h]);
        w[1][h] = V::fma(V::cvt(V::srl(u, 4)), s.d[h], s.m[h]);
      } else {
        w[0][h] = V::mul(V::cvt(V::sub_i(V::and_(u, 15), 8)), s.d[h]);
        w[1][h] = V::mul(V::cvt(V::sub_i(V::srl(u, 4), 8)), s.d[h]);
      }
    }
  }
};

// Q5_0 / Q5_1: Q4 nibbles plus the fifth bits, one u16 per k (bit r = row r).
template <class V, bool kMin>
struct PackQ5 : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32, kStep = 2;
  using Seg = std::conditional_t<kMin, Scale2<V>, Scale1<V>>;
  static Seg seg(const uint8_t* b, int) { return Seg::at(b); }
  static void step(const uint8_t* b, const Seg& s, int, int j, F (&w)[2][H]) {
    const uint8_t* q = b + (kMin ? 64 : 32) + 16 * j;
    const uint8_t* hb = b + (kMin ? 64 : 32) + 256;
    const uint32_t h0 = load_u16(hb + 4 * j), h1 = load_u16(hb + 4 * j + 2);
    for (int h = 0; h < H; ++h) {
      const auto u = V::u8(q + h * V::N);
      const auto q0 = V::or_(V::and_(u, 15), V::bit4(h0, h * V::N));
      const auto q1 = V::or_(V::srl(u, 4), V::bit4(h1, h * V::N));
      if constexpr (kMin) {
        w[0][h] = V::fma(V::cvt(q0), s.d[h], s.m[h]);
        w[1][h] = V::fma(V::cvt(q1), s.d[h], s.m[h]);
      } else {
        w[0][h] = V::mul(V::cvt(V::sub_i(q0, 16)), s.d[h]);
        w[1][h] = V::mul(V::cvt(V::sub_i(q1, 16)), s.d[h]);
      }
    }
  }
};

// Q4_K: segment s is a 32-value sub-block with scale d·sc[s] and min dmin·mn[s];
// value = q·scale − min in one fused multiply-add.
template <class V>
struct PackQ4_K : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr int kValues = 256, kSegs = 8, kSegValues = 32, kStep = 2;
  struct Seg {
    F scale[H], neg_min[H];
  };
  static Seg seg(const uint8_t* b, int s) {
    Seg g;
    for (int h = 0; h < H; ++h) {
      const F d = V::f16(b + 2 * h * V::N), dmin = V::f16(b + 32 + 2 * h * V::N);
      g.scale[h] = V::mul(d, V::cvt(V::u8(b + 64 + 16 * s + h * V::N)));
      g.neg_min[h] = V::neg(V::mul(dmin, V::cvt(V::u8(b + 192 + 16 * s + h * V::N))));
    }
    return g;
  }
  static void step(const uint8_t* b, const Seg& g, int s, int j, F (&w)[2][H]) {
    const uint8_t* q = b + 320 + 16 * (16 * s + j);
    for (int h = 0; h < H; ++h) {
      const auto u = V::u8(q + h * V::N);
      w[0][h] = V::fma(V::cvt(V::and_(u, 15)), g.scale[h], g.neg_min[h]);
      w[1][h] = V::fma(V::cvt(V::srl(u, 4)), g.scale[h], g.neg_min[h]);
    }
  }
};

// Q6_K: segment s is 16 values with scale d·sc[s]; values are stored as int8 q6 − 32.
template <class V>
struct PackQ6_K : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr int kValues = 256, kSegs = 16, kSegValues = 16, kStep = 1;
  struct Seg {
    F scale[H];
  };
  static Seg seg(const uint8_t* b, int s) {
    Seg g;
    for (int h = 0; h < H; ++h)
      g.scale[h] = V::mul(V::f16(b + 2 * h * V::N), V::cvt(V::i8(b + 32 + 16 * s + h * V::N)));
    return g;
  }
  static void step(const uint8_t* b, const Seg& g, int s, int j, F (&w)[1][H]) {
    const uint8_t* q = b + 288 + 16 * (16 * s + j);
    for (int h = 0; h < H; ++h) w[0][h] = V::mul(V::cvt(V::i8(q + h * V::N)), g.scale[h]);
  }
};

// ---- the kernels ----

template <class V>
struct Kernels {
  using F = typename V::F;
  static constexpr int N = V::N;
  static constexpr int H = 16 / N;

  // Stores a group's accumulators for one token: rows row0 .. row0 + 16 of out, the
  // ones below n_out only.
  static void store_group(const F (&acc)[H], float* out, int64_t valid) {
    for (int h = 0; h < H; ++h) {
      const int64_t n = valid - int64_t(h) * N;
      if (n >= N) {
        V::store(out + h * N, acc[h]);
      } else if (n > 0) {
        V::store_n(out + h * N, acc[h], int(n));
      }
    }
  }

  // Calls fn(k, w) for every k of groups' block `blk` in order, w[h] the 16 values of
  // each of the G groups at k (groups at base[g] + blk · block_bytes).
  template <class Dec, int G, class Fn>
  static void for_block(const uint8_t* const (&base)[G], uint64_t block_bytes, int64_t blk,
                        Fn&& fn) {
    const uint8_t* b[G];
    for (int g = 0; g < G; ++g) b[g] = base[g] + uint64_t(blk) * block_bytes;
    for (int s = 0; s < Dec::kSegs; ++s) {
      typename Dec::Seg seg[G];
      for (int g = 0; g < G; ++g) seg[g] = Dec::seg(b[g], s);
      for (int j = 0; j < Dec::kSegValues / Dec::kStep; ++j) {
        F w[G][Dec::kStep][H];
        for (int g = 0; g < G; ++g) Dec::step(b[g], seg[g], s, j, w[g]);
        const int64_t k0 = blk * Dec::kValues + s * Dec::kSegValues + j * Dec::kStep;
        for (int u = 0; u < Dec::kStep; ++u) fn(k0 + u, w, u);
      }
    }
  }

  // G groups × NT tokens, weights decoded in registers.
  template <class Dec, int G, int NT>
  static void gemv_tile(const PackedWeight& p, int64_t g0, const float* x, float* out,
                        int64_t ldo) {
    F acc[G][NT][H];
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < NT; ++t)
        for (int h = 0; h < H; ++h) acc[g][t][h] = V::zero();
    const uint8_t* base[G];
    for (int g = 0; g < G; ++g) base[g] = p.group(g0 + g);
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues;
    for (int64_t blk = 0; blk < blocks; ++blk)
      for_block<Dec, G>(base, bb, blk, [&](int64_t k, const F(&w)[G][Dec::kStep][H], int u) {
        for (int t = 0; t < NT; ++t) {
          const F xb = V::bcast(x + t * n + k);
          for (int g = 0; g < G; ++g)
            for (int h = 0; h < H; ++h) acc[g][t][h] = V::fma(w[g][u][h], xb, acc[g][t][h]);
        }
      });
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < NT; ++t)
        store_group(acc[g][t], out + t * ldo + (g0 + g) * 16, p.n_out - (g0 + g) * 16);
  }

  template <class Dec, int NT>
  static void gemv(const PackedWeight& p, int64_t g0, int64_t g1, const float* x, float* out) {
    constexpr int G = NT == 1 ? V::kGemvG : 1;
    int64_t g = g0;
    for (; g + G <= g1; g += G) gemv_tile<Dec, G, NT>(p, g, x, out, p.n_out);
    for (; g < g1; ++g) gemv_tile<Dec, 1, NT>(p, g, x, out, p.n_out);
  }

  // Groups [g0, g0 + ng) decoded into panel, group i at panel + i · n · 16, [k][16].
  template <class Dec>
  static void decode_panel(const PackedWeight& p, int64_t g0, int ng, float* panel) {
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues;
    for (int i = 0; i < ng; ++i) {
      const uint8_t* const base[1] = {p.group(g0 + i)};
      float* dst = panel + int64_t(i) * n * 16;
      for (int64_t blk = 0; blk < blocks; ++blk)
        for_block<Dec, 1>(base, bb, blk, [&](int64_t k, const F(&w)[1][Dec::kStep][H], int u) {
          for (int h = 0; h < H; ++h) V::store(dst + k * 16 + h * N, w[0][u][h]);
        });
    }
  }

  // TG panel groups (stride ps floats) × NT tokens, k = 0 .. n in order; xp holds the
  // tokens' x transposed, [n][kTileT] (one base pointer for all the broadcasts).
  template <int TG, int NT>
  static void tile(const float* panel, int64_t ps, const float* xp, int64_t n, float* out,
                   int64_t ldo, int64_t valid) {
    constexpr int TT = V::kTileT;
    F acc[TG][NT][H];
    for (int g = 0; g < TG; ++g)
      for (int t = 0; t < NT; ++t)
        for (int h = 0; h < H; ++h) acc[g][t][h] = V::zero();
#pragma GCC unroll 2
    for (int64_t k = 0; k < n; ++k) {
      F w[TG][H];
      for (int g = 0; g < TG; ++g)
        for (int h = 0; h < H; ++h) w[g][h] = V::load(panel + g * ps + k * 16 + h * N);
      for (int t = 0; t < NT; ++t) {
        const F xb = V::bcast(xp + k * TT + t);
        for (int g = 0; g < TG; ++g)
          for (int h = 0; h < H; ++h) acc[g][t][h] = V::fma(w[g][h], xb, acc[g][t][h]);
      }
    }
    for (int g = 0; g < TG; ++g)
      for (int t = 0; t < NT; ++t) store_group(acc[g][t], out + t * ldo + g * 16, valid - g * 16);
  }

  template <int TG, int... Ts>
  static void tile_tokens(int nt, const float* panel, int64_t ps, const float* x, int64_t n,
                          float* out, int64_t ldo, int64_t valid,
                          std::integer_sequence<int, Ts...>) {
    ((nt == Ts + 1 ? tile<TG, Ts + 1>(panel, ps, x, n, out, ldo, valid) : void()), ...);
  }
  template <int TG>
  static void tile_any(int nt, const float* panel, int64_t ps, const float* x, int64_t n,
                       float* out, int64_t ldo, int64_t valid) {
    tile_tokens<TG>(nt, panel, ps, x, n, out, ldo, valid,
                    std::make_integer_sequence<int, V::kTileT>{});
  }

  // x [T][n] transposed per tile of kTileT tokens: tile i at xt + i·n·kTileT, [n][kTileT]
  // (one base pointer for all the broadcasts of a tile).
  static void transpose_x(const float* x, int64_t T, int64_t n, float* xt) {
    constexpr int TT = V::kTileT;
    for (int64_t i = 0; i * TT < T; ++i) {
      float* dst = xt + i * n * TT;
      const int nt = int(std::min<int64_t>(TT, T - i * TT));
      for (int t = 0; t < nt; ++t) {
        const float* src = x + (i * TT + t) * n;
        for (int64_t k = 0; k < n; ++k) dst[k * TT + t] = src[k];
      }
    }
  }

  template <class Dec>
  static void panel(const PackedWeight& p, int64_t g0, int64_t g1, const float* xp, int64_t T,
                    float* out) {
    constexpr int TG = V::kTileG, TT = V::kTileT;
    const int64_t n = p.n_in, ps = n * 16;
    // Groups per panel: about 192 KiB of decoded weights (stays in L2 while the tokens
    // sweep it), a multiple of the tile height.
    const int64_t fit = std::max<int64_t>(TG, (int64_t(192) << 10) / (ps * 4)) / TG * TG;
    const int64_t pg = std::min<int64_t>(fit, 16);
    thread_local ScratchFloats buf;
    buf.reserve(size_t(pg * ps));
    for (int64_t q0 = g0; q0 < g1; q0 += pg) {
      const int ng = int(std::min(pg, g1 - q0));
      decode_panel<Dec>(p, q0, ng, buf.data());
      for (int64_t t = 0; t < T; t += TT) {
        const int nt = int(std::min<int64_t>(TT, T - t));
        for (int g = 0; g < ng; g += TG) {
          const float* pan = buf.data() + g * ps;
          float* o = out + t * p.n_out + (q0 + g) * 16;
          const int64_t valid = p.n_out - (q0 + g) * 16;
          const float* xt = xp + (t / TT) * n * TT;
          if (g + TG <= ng) {
            tile_any<TG>(nt, pan, ps, xt, n, o, p.n_out, valid);
          } else {
            tile_any<1>(nt, pan, ps, xt, n, o, p.n_out, valid);
          }
        }
      }
    }
  }

  // T rows as gemv over slices of kSliceT rows (then 8, then 4 or fewer): each slice
  // decodes every weight group once, in registers, for all its rows. The arithmetic per
  // output is gemv's (and panel's), so the slicing changes no bit.
  static constexpr int kSliceT = H == 1 ? 16 : 4;
  template <class Dec>
  static void gemv_slices(const PackedWeight& p, int64_t g0, int64_t g1, const float* x,
                          int64_t T, float* out) {
    for (int64_t t0 = 0; t0 < T;) {
      const float* xs = x + t0 * p.n_in;
      float* os = out + t0 * p.n_out;
      const int64_t left = T - t0;
      int64_t n = std::min<int64_t>(4, left);
      if (kSliceT >= 16 && left >= 16) {
        gemv<Dec, 16>(p, g0, g1, xs, os);
        n = 16;
      } else if (kSliceT >= 8 && left >= 8) {
        gemv<Dec, 8>(p, g0, g1, xs, os);
        n = 8;
      } else if (n == 4) {
        gemv<Dec, 4>(p, g0, g1, xs, os);
      } else if (n == 3) {
        gemv<Dec, 3>(p, g0, g1, xs, os);
      } else if (n == 2) {
        gemv<Dec, 2>(p, g0, g1, xs, os);
      } else {
        gemv<Dec, 1>(p, g0, g1, xs, os);
      }
      t0 += n;
    }
  }

  template <class Dec>
  static void run(const PackedWeight& p, int64_t g0, int64_t g1, const float* x,
                  const float* xt, int64_t T, float* out) {
    switch (T) {
      case 1:
        gemv<Dec, 1>(p, g0, g1, x, out);
        return;
      case 2:
        gemv<Dec, 2>(p, g0, g1, x, out);
        return;
      case 3:
        gemv<Dec, 3>(p, g0, g1, x, out);
        return;
      case 4:
        gemv<Dec, 4>(p, g0, g1, x, out);
        return;
      default:
        if (T <= kGemvSlicesMaxT) {  // a batch of decode rows
          gemv_slices<Dec>(p, g0, g1, x, T, out);
          return;
        }
        panel<Dec>(p, g0, g1, xt, T, out);
        return;
    }
  }

  // Row groups [g0, g1) of out [T][p.n_out] = x [T][p.n_in] · Wᵀ.
  static void matmul_groups(const PackedWeight& p, int64_t g0, int64_t g1, const float* x,
                            const float* xt, int64_t T, float* out) {
    switch (p.type) {
      case GgmlType::F32:
        run<PackFloat<V, 4, LoadF32<V>>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::F16:
        run<PackFloat<V, 2, LoadF16<V>>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::BF16:
        run<PackFloat<V, 2, LoadBF16<V>>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q8_0:
        run<PackQ8_0<V>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q4_0:
        run<PackQ4<V, false>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q4_1:
        run<PackQ4<V, true>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q5_0:
        run<PackQ5<V, false>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q5_1:
        run<PackQ5<V, true>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q4_K:
        run<PackQ4_K<V>>(p, g0, g1, x, xt, T, out);
        return;
      case GgmlType::Q6_K:
        run<PackQ6_K<V>>(p, g0, g1, x, xt, T, out);
        return;
      default:
        return;  // pack_weight accepts no other type
    }
  }
};

}  // namespace
}  // namespace kvscope::cpu
