// kernels_impl.h — CPU matrix products on packed quantized weights, written once against
// a vector interface V (simd_avx512.h, simd_avx2.h, simd_scalar.h) and compiled once per
// instruction set by engine/cpu/kernels_{avx512,avx2,scalar}.cpp. Everything here has
// internal linkage, so the copies built for different instruction sets never mix.
//
// out[t][o] = Σ_k W[o][k]·x[t][k], x [T][n] fp32, W packed (packed_weight.h): sixteen
// rows per group, one vector lane per row. The arithmetic of one output element is fixed
// — and therefore independent of T, of the thread split, of which kernel below runs and
// even of the instruction set:
//  - float weights (F32, F16, BF16): the accumulator starts at 0 and adds W[o][k]·x[t][k]
//    for k = 0, 1, 2, ... in order, each with one fused multiply-add;
//  - quantized weights, value q·d + m with d and m per segment (kSegValues values):
//    per segment, s_q starts at 0 and adds q_k·x[t][k] in order with fused multiply-adds,
//    then acc = fma(d, s_q, acc) and, for the types with an offset, acc = fma(m, Σx, acc)
//    with Σx the segment's sum of x (segment_sums, kernels.h; made once per product). So
//    the hot loop is one convert (for 4-bit fields on AVX-512, a table lookup: nibbles)
//    and one multiply-add per value, and the scales cost two multiply-adds per segment;
//  - every q, d and m comes from the same decoder (Pack*<V>::qstep / scales below).
// Kernels:
//  - gemv (T = 1, the decode step): each packed group is streamed once, with
//    software prefetch, and decoded in registers one vector at a time straight into the
//    token accumulators, kGemvG groups at a time so that their multiply-add chains
//    overlap; the scales wait in a small fp32 buffer, not in registers, and so do the
//    quantized types' accumulators between segments, so that on AVX2 (sixteen
//    registers) the s_q chains never spill to memory;
//  - gemv slices (1 < T <= kGemvSlicesMaxT, a few rows or a batch of decode rows): gemv tiles
//    of 2 groups × 8 rows (AVX-512; 1 group × 4 rows on AVX2), then 4 or fewer rows, each
//    tile's rows in turn over the same groups, so its weights come from memory once;
//    On AVX-512 the quantized types take these tiles at every T, prefill included;
//  - rows (the quantized types past one slice of rows): as the slices, but each segment
//    of a tile's groups is decoded once into an fp32 block in L1 for up to kRowsMax rows,
//    whose slices then read it back, with x interleaved by slice (interleave_x) so that
//    one pointer reaches every row's value (two for AVX2's slices of 6 rows, which run
//    over two interleaved blocks of 4);
//  - panel (T > kGemvSlicesMaxT, prefill and NO CACHE, for the float types and on AVX2 and
//    the scalar path): a few groups are decoded once into an fp32
//    panel [k][16] that stays in L2, then swept by register tiles of kTileG groups ×
//    kTileT tokens (x broadcast from its transposed copy, made once per product by
//    transpose_x), so every decoded value serves every token; for the quantized types the
//    panel holds q, with each segment's d and m beside it, and the tiles apply them per
//    segment as gemv does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "engine/cpu/kernels.h"
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
// A block of kValues k-values is kSegs segments of kSegValues. scales(b, s, sc) writes
// segment s's per-row scale fields as fp32, sc[kScales][16] (field f of row r at
// sc[f·16 + r]: the scale d, then, where the type has one, the offset m). The float types
// have no scales: step(b, sc, s, j, h, w) decodes k-values [j·kStep, (j+1)·kStep) for
// lanes h·N .. h·N + N of the group (one vector: the h-th of the group's H) into w[u].
// The quantized types (kFactored) decode only the integers instead: qstep(b, s, j, h, q)
// writes the same k-values' q as exact fp32, and a kernel applies the scales once per
// segment (see "the kernels" below). One vector at a time, with the scales in memory
// rather than in registers, so that a kernel can keep many independent accumulator
// chains in registers (AVX2 has sixteen). The offsets follow the layouts in
// packed_weight.h; each type's q, d and m are the ones in the test's reference
// (tests/engine/test_matmul.cpp, kernel_q and kernel_scales).

template <class V>
struct Lanes {
  static constexpr int H = 16 / V::N;  // vectors per 16-row group
  using F = typename V::F;
};

template <class V, int E, class Load>
struct PackFloat : Lanes<V> {
  using typename Lanes<V>::F;
  static constexpr bool kFactored = false;
  static constexpr int kValues = 1, kSegs = 1, kSegValues = 1, kStep = 1, kScales = 0;
  static void scales(const uint8_t*, int, float*) {}
  static void step(const uint8_t* b, const float*, int, int, int h, F (&w)[1]) {
    w[0] = Load::load(b + E * h * V::N);
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

// d[16] f16 at b (and m[16] f16 at b + 32 when kMin) as fp32 into sc.
template <class V, bool kMin>
void f16_scales(const uint8_t* b, float* sc) {
  for (int h = 0; h < Lanes<V>::H; ++h) {
    V::store(sc + h * V::N, V::f16(b + 2 * h * V::N));
    if constexpr (kMin) V::store(sc + 16 + h * V::N, V::f16(b + 32 + 2 * h * V::N));
  }
}

// Q8_0: q is the int8, d the block scale.
template <class V>
struct PackQ8_0 : Lanes<V> {
  using typename Lanes<V>::F;
  static constexpr bool kFactored = true;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32, kStep = 1, kScales = 1;
  static void scales(const uint8_t* b, int, float* sc) { f16_scales<V, false>(b, sc); }
  static void qstep(const uint8_t* b, int, int j, int h, F (&q)[1]) {
    q[0] = V::cvt(V::i8(b + 32 + 16 * j + h * V::N));
  }
};

// The two nibbles of u (one byte per lane, widened), each minus kBias, as exact fp32
// into q[0] (low) and q[1] (high). Where the vector has a 16-entry table lookup (lut16,
// AVX-512) a nibble's value comes from a table of the 16 results: the lookup reads only
// the index's low 4 bits, so the low nibble needs no mask, and it replaces the convert
// (and the bias): two values of 16 rows take four instructions with the widening load
// instead of five (seven with kBias). The same values either way. The decode shares the
// vector ports with the multiply-adds: with the lookup a product of 16 rows takes 5% less
// time on one thread, and of one row (weights in cache) 22% less.
// kSplit (rows_q's decoding, with no multiply-adds beside it): the high nibble is
// converted instead of looked up. The lookups and the widening load all issue on one
// vector port (port 5 on Intel cores) and the shift and convert on the other, so two
// values take two cycles rather than three: 3-4% less time for products of 16 to 512
// rows on one thread. Interleaved with the single-token product's multiply-adds, which
// use both ports, the lookups are faster (16% in cache).
alignas(64) constexpr float kNibbleValues[2][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7}};
template <class V, int kBias, bool kSplit = false>
void nibbles(typename V::I u, typename V::F (&q)[2]) {
  static_assert(kBias == 0 || kBias == 8);
  if constexpr (requires(typename V::I a, typename V::F t) { V::lut16(a, t); }) {
    const typename V::F table = V::load(kNibbleValues[kBias / 8]);
    q[0] = V::lut16(u, table);
    if constexpr (!kSplit)
      q[1] = V::lut16(V::srl(u, 4), table);
    else if constexpr (kBias == 0)
      q[1] = V::cvt(V::srl(u, 4));
    else
      q[1] = V::cvt(V::sub_i(V::srl(u, 4), kBias));
  } else if constexpr (kBias == 0) {
    q[0] = V::cvt(V::and_(u, 15));
    q[1] = V::cvt(V::srl(u, 4));
  } else {
    q[0] = V::cvt(V::sub_i(V::and_(u, 15), kBias));
    q[1] = V::cvt(V::sub_i(V::srl(u, 4), kBias));
  }
}

// Q4_0 / Q4_1: a step is one byte per row: value 2j in the low nibble, 2j+1 in the high.
// q is the nibble − 8 (Q4_0) or the nibble with the offset m (Q4_1).
template <class V, bool kMin>
struct PackQ4 : Lanes<V> {
  using typename Lanes<V>::F;
  static constexpr bool kFactored = true;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32, kStep = 2;
  static constexpr int kScales = kMin ? 2 : 1;
  static void scales(const uint8_t* b, int, float* sc) { f16_scales<V, kMin>(b, sc); }
  template <bool kSplit = false>
  static void qstep(const uint8_t* b, int, int j, int h, F (&q)[2]) {
    nibbles<V, kMin ? 0 : 8, kSplit>(V::u8(b + (kMin ? 64 : 32) + 16 * j + h * V::N), q);
  }
};

// Q5_0 / Q5_1: Q4 nibbles plus the fifth bits, one u16 per k (bit r = row r); q − 16
// (Q5_0) or q with the offset m (Q5_1).
template <class V, bool kMin>
struct PackQ5 : Lanes<V> {
  using typename Lanes<V>::F;
  static constexpr bool kFactored = true;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32, kStep = 2;
  static constexpr int kScales = kMin ? 2 : 1;
  static void scales(const uint8_t* b, int, float* sc) { f16_scales<V, kMin>(b, sc); }
  static void qstep(const uint8_t* b, int, int j, int h, F (&q)[2]) {
    const uint8_t* qs = b + (kMin ? 64 : 32) + 16 * j;
    const uint8_t* hb = b + (kMin ? 64 : 32) + 256;
    const uint32_t h0 = load_u16(hb + 4 * j), h1 = load_u16(hb + 4 * j + 2);
    const auto u = V::u8(qs + h * V::N);
    const auto q0 = V::or_(V::and_(u, 15), V::bit4(h0, h * V::N));
    const auto q1 = V::or_(V::srl(u, 4), V::bit4(h1, h * V::N));
    if constexpr (kMin) {
      q[0] = V::cvt(q0);
      q[1] = V::cvt(q1);
    } else {
      q[0] = V::cvt(V::sub_i(q0, 16));
      q[1] = V::cvt(V::sub_i(q1, 16));
    }
  }
};

// Q4_K: segment s is a 32-value sub-block with scale d·sc[s] and offset −dmin·mn[s].
template <class V>
struct PackQ4_K : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr bool kFactored = true;
  static constexpr int kValues = 256, kSegs = 8, kSegValues = 32, kStep = 2, kScales = 2;
  static void scales(const uint8_t* b, int s, float* sc) {
    for (int h = 0; h < H; ++h) {
      const F d = V::f16(b + 2 * h * V::N), dmin = V::f16(b + 32 + 2 * h * V::N);
      V::store(sc + h * V::N, V::mul(d, V::cvt(V::u8(b + 64 + 16 * s + h * V::N))));
      V::store(sc + 16 + h * V::N,
               V::neg(V::mul(dmin, V::cvt(V::u8(b + 192 + 16 * s + h * V::N)))));
    }
  }
  template <bool kSplit = false>
  static void qstep(const uint8_t* b, int s, int j, int h, F (&q)[2]) {
    nibbles<V, 0, kSplit>(V::u8(b + 320 + 16 * (16 * s + j) + h * V::N), q);
  }
};

// Q5_K: Q4_K with a fifth bit per value, one u16 per k after the nibbles (bit r = row r).
template <class V>
struct PackQ5_K : Lanes<V> {
  using typename Lanes<V>::F;
  static constexpr bool kFactored = true;
  static constexpr int kValues = 256, kSegs = 8, kSegValues = 32, kStep = 2, kScales = 2;
  static void scales(const uint8_t* b, int s, float* sc) { PackQ4_K<V>::scales(b, s, sc); }
  static void qstep(const uint8_t* b, int s, int j, int h, F (&q)[2]) {
    const int k = 32 * s + 2 * j;  // the step's first value
    const uint8_t* hb = b + 320 + 2048;
    const auto u = V::u8(b + 320 + 16 * (16 * s + j) + h * V::N);
    q[0] = V::cvt(V::or_(V::and_(u, 15), V::bit4(load_u16(hb + 2 * k), h * V::N)));
    q[1] = V::cvt(V::or_(V::srl(u, 4), V::bit4(load_u16(hb + 2 * k + 2), h * V::N)));
  }
};

// Q6_K: segment s is 16 values with scale d·sc[s]; values are stored as int8 q6 − 32.
template <class V>
struct PackQ6_K : Lanes<V> {
  using typename Lanes<V>::F;
  using Lanes<V>::H;
  static constexpr bool kFactored = true;
  static constexpr int kValues = 256, kSegs = 16, kSegValues = 16, kStep = 1, kScales = 1;
  static void scales(const uint8_t* b, int s, float* sc) {
    for (int h = 0; h < H; ++h)
      V::store(sc + h * V::N,
               V::mul(V::f16(b + 2 * h * V::N), V::cvt(V::i8(b + 32 + 16 * s + h * V::N))));
  }
  static void qstep(const uint8_t* b, int s, int j, int h, F (&q)[1]) {
    q[0] = V::cvt(V::i8(b + 288 + 16 * (16 * s + j) + h * V::N));
  }
};

// Q4_0 / Q4_1 / Q4_K in NibbleOrder::Words (packed_weight.h): a step is one u32 per row, 8
// values. value() decodes value u of the step exactly (a shift and a mask, a convert; on
// AVX-512 a shift and the 16-entry table lookup of the byte order, the same numbers);
// scaled() gives q·2^word_shift(u) (kernels.h) with one mask and a convert, for a product
// whose x comes pre-scaled by words_x: on AVX2 that is two vector operations per value of
// 8 rows, against the byte order's five per two (widening load, mask, shift, two
// converts), and the decode shares the ports with the multiply-adds. Q4_0's q is the
// nibble − 8 (− 8·2^word_shift(u) scaled), still an exact integer before the convert.
template <class V, int kBias>
struct Words : Lanes<V> {
  using typename Lanes<V>::F;
  using I = typename V::I;
  static constexpr bool kWords = true;
  static constexpr bool kFactored = true;
  static constexpr int kStep = 8;
  static F value(I w, int u) {
    if constexpr (requires(I a, F t) { V::lut16(a, t); }) {
      // The table lookup reads the index's low 4 bits only: value u after one shift.
      const F table = V::load(kNibbleValues[kBias / 8]);
      return V::lut16(u == 0 ? w : V::srl(w, unsigned(4 * u)), table);
    }
    I q = u == 0   ? V::and_(w, 15)
          : u == 7 ? V::srl(w, 28)
                   : V::and_(V::srl(w, unsigned(4 * u)), 15);
    if constexpr (kBias != 0) q = V::sub_i(q, kBias);
    return V::cvt(q);
  }
  static F scaled(I w, int u) {
    I q = u == 7 ? V::srl(w, 28) : V::and_(w, 15 << (4 * u));
    if constexpr (kBias != 0) q = V::sub_i(q, kBias << word_shift(u));
    return V::cvt(q);
  }
};
template <class V, bool kMin>
struct PackQ4W : Words<V, kMin ? 0 : 8> {
  using typename Words<V, kMin ? 0 : 8>::F;
  static constexpr int kValues = 32, kSegs = 1, kSegValues = 32;
  static constexpr int kScales = kMin ? 2 : 1;
  static void scales(const uint8_t* b, int, float* sc) { f16_scales<V, kMin>(b, sc); }
  static typename V::I word(const uint8_t* b, int, int j, int h) {
    return V::u32(b + (kMin ? 64 : 32) + 64 * j + 4 * h * V::N);
  }
  static void qstep(const uint8_t* b, int s, int j, int h, F (&q)[8]) {
    const auto w = word(b, s, j, h);
    for (int u = 0; u < 8; ++u) q[u] = PackQ4W::value(w, u);
  }
};
template <class V>
struct PackQ4_KW : Words<V, 0> {
  using typename Words<V, 0>::F;
  static constexpr int kValues = 256, kSegs = 8, kSegValues = 32, kScales = 2;
  static void scales(const uint8_t* b, int s, float* sc) { PackQ4_K<V>::scales(b, s, sc); }
  static typename V::I word(const uint8_t* b, int s, int j, int h) {
    return V::u32(b + 320 + 256 * s + 64 * j + 4 * h * V::N);
  }
  static void qstep(const uint8_t* b, int s, int j, int h, F (&q)[8]) {
    const auto w = word(b, s, j, h);
    for (int u = 0; u < 8; ++u) q[u] = PackQ4_KW::value(w, u);
  }
};

// ---- the kernels ----

// How far ahead of its reads the single-token products prefetch each weight stream. A
// decode step reads every weight once, straight from memory: without software prefetch
// the hardware prefetcher, retrained on every short group stream, leaves the loads
// waiting on memory (1.75× the time on AVX2 at one thread); 2 KiB ahead measured best
// (1, 4 KiB: a few % slower).
constexpr int64_t kPrefetchBytes = 2048;
// The prefetch's locality hint: 1 (prefetcht2, into L2 and beyond, not L1). On a Zen 4
// EPYC, bench's tg128 ran 1.20-1.30x as fast as with prefetcht0 (3), at both ISAs and at
// one and two threads; prefill unchanged (docs/performance.md, AVX2 decode). On a Zen 5
// EPYC it measured level with prefetcht0 (tg128 1.01x).
constexpr int kPrefetchLocality = 1;

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

  // store_group of 16 accumulators waiting in memory.
  static void store_floats(const float* acc, float* out, int64_t valid) {
    F v[H];
    for (int h = 0; h < H; ++h) v[h] = V::load(acc + h * N);
    store_group(v, out, valid);
  }

  // Software prefetch of the next weight blocks, kPrefetchBytes ahead in each of G group
  // streams (b[g], block_bytes apiece); past a group's end (`end`: group 0's), the same
  // place in the group that the next tile reads in this stream's place. Addresses as
  // integers: the prefetch may point past the weight (it never faults).
  template <int G>
  static void prefetch_groups(const uint8_t* const* b, uintptr_t end, uint64_t group_bytes,
                              uint64_t block_bytes) {
    for (int g = 0; g < G; ++g) {
      uintptr_t pf = reinterpret_cast<uintptr_t>(b[g]) + kPrefetchBytes;
      if (pf >= end + g * group_bytes) pf += (G - 1) * group_bytes;
      for (uint64_t off = 0; off < block_bytes; off += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(pf + off), 0, kPrefetchLocality);
    }
  }

  // The float types: G groups × NT tokens, weights decoded in registers, one vector (8 or 16 rows
  // of a group) at a time: each vector's accumulator chains stay in registers and the G·H chains of
  // one token overlap.
  template <class Dec, int G, int NT>
  static void gemv_tile(const PackedWeight& p, int64_t g0, const float* x, float* out,
                        int64_t ldo) {
    constexpr int S = Dec::kStep, NS = Dec::kScales > 0 ? Dec::kScales : 1;
    F acc[G][NT][H];
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < NT; ++t)
        for (int h = 0; h < H; ++h) acc[g][t][h] = V::zero();
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues;
    alignas(64) float sc[G][NS * 16];
    const uint8_t* b[G];
    for (int g = 0; g < G; ++g) b[g] = p.group(g0 + g);
    const uintptr_t end = reinterpret_cast<uintptr_t>(b[0]) + p.group_bytes;  // of group 0
    for (int64_t blk = 0; blk < blocks; ++blk) {
      prefetch_groups<G>(b, end, p.group_bytes, bb);
      for (int s = 0; s < Dec::kSegs; ++s) {
        for (int g = 0; g < G; ++g) Dec::scales(b[g], s, sc[g]);
        const float* xs = x + blk * Dec::kValues + s * Dec::kSegValues;
        for (int j = 0; j < Dec::kSegValues / S; ++j) {
          const float* xk = xs + j * S;
          if constexpr (NT == 1) {
            F xb[S];
            for (int u = 0; u < S; ++u) xb[u] = V::bcast(xk + u);
            for (int g = 0; g < G; ++g)
              for (int h = 0; h < H; ++h) {
                F w[S];
                Dec::step(b[g], sc[g], s, j, h, w);
                for (int u = 0; u < S; ++u) acc[g][0][h] = V::fma(w[u], xb[u], acc[g][0][h]);
              }
          } else {
            F w[G][H][S];
            for (int g = 0; g < G; ++g)
              for (int h = 0; h < H; ++h) Dec::step(b[g], sc[g], s, j, h, w[g][h]);
            for (int u = 0; u < S; ++u)
              for (int t = 0; t < NT; ++t) {
                const F xb = V::bcast(xk + t * n + u);
                for (int g = 0; g < G; ++g)
                  for (int h = 0; h < H; ++h) acc[g][t][h] = V::fma(w[g][h][u], xb, acc[g][t][h]);
              }
          }
        }
      }
      for (int g = 0; g < G; ++g) b[g] += bb;
    }
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < NT; ++t)
        store_group(acc[g][t], out + t * ldo + (g0 + g) * 16, p.n_out - (g0 + g) * 16);
  }

  // The quantized types: per segment, s_q = Σ q_k·x_k (one multiply-add per value, k in
  // order, from 0) for each row, then acc = acc + d·s_q and, where the type has an offset,
  // acc = acc + m·Σx (sx: the token's segment sums, segment_sums). The accumulators wait
  // in memory between segments, so that the s_q chains have the registers. kScaled (the
  // Words decoders): x is words_x's, and each q comes scaled to match (Words::scaled).
  template <class Dec, int G, int NT, bool kScaled = false>
  static void gemv_tile_q(const PackedWeight& p, int64_t g0, const float* x, const float* sx,
                          float* out, int64_t ldo) {
    constexpr int S = Dec::kStep, NS = Dec::kScales;
    alignas(64) float acc[G][NT][16] = {};
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues, nsx = n / kXSumValues;
    alignas(64) float sc[G][NS * 16];
    const uint8_t* b[G];
    for (int g = 0; g < G; ++g) b[g] = p.group(g0 + g);
    const uintptr_t end = reinterpret_cast<uintptr_t>(b[0]) + p.group_bytes;  // of group 0
    for (int64_t blk = 0; blk < blocks; ++blk) {
      prefetch_groups<G>(b, end, p.group_bytes, bb);
      for (int s = 0; s < Dec::kSegs; ++s) {
        for (int g = 0; g < G; ++g) Dec::scales(b[g], s, sc[g]);
        const float* xs = x + blk * Dec::kValues + s * Dec::kSegValues;
        F sq[G][NT][H];
        for (int g = 0; g < G; ++g)
          for (int t = 0; t < NT; ++t)
            for (int h = 0; h < H; ++h) sq[g][t][h] = V::zero();
        for (int j = 0; j < Dec::kSegValues / S; ++j) {
          const float* xk = xs + j * S;
          if constexpr (requires { Dec::kWords; }) {
            // One value of every group and row at a time: the words are read again for
            // each (from L1) rather than held, so the s_q chains keep the registers.
            // Unrolled, so that each value's mask is a constant.
#pragma GCC unroll 8
            for (int u = 0; u < S; ++u) {
              F xb[NT];
              for (int t = 0; t < NT; ++t) xb[t] = V::bcast(xk + t * n + u);
              for (int g = 0; g < G; ++g)
                for (int h = 0; h < H; ++h) {
                  const auto w = Dec::word(b[g], s, j, h);
                  const F q = kScaled ? Dec::scaled(w, u) : Dec::value(w, u);
                  for (int t = 0; t < NT; ++t) sq[g][t][h] = V::fma(q, xb[t], sq[g][t][h]);
                }
            }
          } else if constexpr (NT == 1) {
            F xb[S];
            for (int u = 0; u < S; ++u) xb[u] = V::bcast(xk + u);
            for (int g = 0; g < G; ++g)
              for (int h = 0; h < H; ++h) {
                F q[S];
                Dec::qstep(b[g], s, j, h, q);
                for (int u = 0; u < S; ++u) sq[g][0][h] = V::fma(q[u], xb[u], sq[g][0][h]);
              }
          } else {
            F q[G][H][S];
            for (int g = 0; g < G; ++g)
              for (int h = 0; h < H; ++h) Dec::qstep(b[g], s, j, h, q[g][h]);
            for (int u = 0; u < S; ++u)
              for (int t = 0; t < NT; ++t) {
                const F xb = V::bcast(xk + t * n + u);
                for (int g = 0; g < G; ++g)
                  for (int h = 0; h < H; ++h) sq[g][t][h] = V::fma(q[g][h][u], xb, sq[g][t][h]);
              }
          }
        }
        const int64_t seg = blk * Dec::kSegs + s;
        for (int g = 0; g < G; ++g)
          for (int t = 0; t < NT; ++t)
            for (int h = 0; h < H; ++h) {
              F a = V::fma(V::load(sc[g] + h * N), sq[g][t][h], V::load(acc[g][t] + h * N));
              if constexpr (NS == 2)
                a = V::fma(V::load(sc[g] + 16 + h * N), V::bcast(sx + t * nsx + seg), a);
              V::store(acc[g][t] + h * N, a);
            }
      }
      for (int g = 0; g < G; ++g) b[g] += bb;
    }
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < NT; ++t)
        store_floats(acc[g][t], out + t * ldo + (g0 + g) * 16, p.n_out - (g0 + g) * 16);
  }

  // T rows (a batch of decode rows) as gemv tiles of kSliceG groups × kSliceT rows (then
  // 4 or fewer rows), groups outer and rows inner. Two groups per tile on AVX-512 (32
  // registers: 2 × 8 accumulator chains and the decoded weights) make every broadcast of
  // x serve two multiply-adds. The arithmetic per output is gemv's (and panel's), so the
  // tiling changes no bit. Up to kSliceT rows a tile decodes its weights in registers
  // (gemv_tile_q); past that, the quantized types decode each segment once for all the
  // slices (rows_q), except where rows_kernel_on says otherwise (AVX-512 on Zen 5, where
  // the slices measured faster: kernels.h), and there every slice runs gemv_tile_q.
  static constexpr int kSliceG = H == 1 ? 2 : 1;
  static constexpr int kSliceT = H == 1 ? 8 : 4;

  // The quantized types over more rows than one slice (a batch of decode rows, a
  // prefill), rows_q: per segment, G groups' q are decoded once into qb (an fp32 block in
  // L1), then each slice of NT rows runs its s_q chains over qb. So a weight is decoded
  // once per kRowsMax rows instead of once per slice, which leaves the vector ports to the
  // multiply-adds (the decoding and the multiply-adds share them): 1.07× (16 rows) to
  // 1.17× (64) the gemv tiles' speed on one AVX-512 thread, 1.15× with AVX2 at 8 to 16
  // rows. The same arithmetic per output as gemv_tile_q: the q are the same exact fp32
  // values, each s_q adds k in order from 0, then d·s_q and m·Σx.
  static constexpr int64_t kRowsMax = 64;
  // One slice of NT rows over qb; xs: the segment's x interleaved, value k of row t at
  // xs[k · kSliceT + t] for the slice's first NA rows, row t ≥ NA's at
  // xs2[k · kSliceT + t − NA] (a slice that runs on into the next interleaved block of
  // kSliceT rows); sxs: row 0's sum of the segment, row t's nsx further on. Never
  // inlined: inlined into rows_q, beside the decoder's constants, GCC kept one s_q chain
  // and a weight vector on the stack (a store and a reload per k on the critical path), and
  // on its own the slice runs from registers: a decode step of 16 sequences 1.17x as fast,
  // a 512-token prefill about 1.15x (AVX-512, 2 threads). The scales' loop at the end is
  // unrolled too: rolled, it reads the s_q chains by index, so GCC stored all of them to
  // the stack and loaded them back at every segment (a product of 64 rows 1.07-1.09x as
  // fast unrolled on an AMX-capable Xeon, one thread; the same instructions otherwise).
  template <class Dec, int G, int NT, int NA = NT>
  [[gnu::noinline]] static void rows_slice_q(const float (&qb)[G][Dec::kSegValues][16],
                                             const float (&sc)[G][32], const float* xs,
                                             const float* xs2, const float* sxs, int64_t nsx,
                                             float (*acc)[16], bool first) {
    static_assert(NA >= 1 && NA <= NT);
    constexpr int NS = Dec::kScales;
    F sq[G][NT][H];
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < NT; ++t)
        for (int h = 0; h < H; ++h) sq[g][t][h] = V::zero();
    for (int k = 0; k < Dec::kSegValues; ++k) {
      F w[G][H];
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < H; ++h) w[g][h] = V::load(qb[g][k] + h * N);
      for (int t = 0; t < NT; ++t) {
        const F xb = V::bcast(t < NA ? xs + k * kSliceT + t : xs2 + k * kSliceT + (t - NA));
        for (int g = 0; g < G; ++g)
          for (int h = 0; h < H; ++h) sq[g][t][h] = V::fma(w[g][h], xb, sq[g][t][h]);
      }
    }
#pragma GCC unroll 16
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) {
        float* a = acc[g * kRowsMax + t];
        for (int h = 0; h < H; ++h) {
          // The first segment starts from 0: the same sum as adding to a zeroed
          // accumulator, without zeroing one.
          const F prev = first ? V::zero() : V::load(a + h * N);
          F v = V::fma(V::load(sc[g] + h * N), sq[g][t][h], prev);
          if constexpr (NS == 2)
            v = V::fma(V::load(sc[g] + 16 + h * N), V::bcast(sxs + t * nsx), v);
          V::store(a + h * N, v);
        }
      }
  }
  // The rows of one rows_q slice: kSliceT, except with AVX2's sixteen registers. There a
  // slice of 4 rows keeps 8 accumulator chains (2 vectors × 4 rows), no more than the
  // multiply-adds' latency times their rate, so any delay of one stalls the port; 6 rows
  // keep 12 chains (15 registers with the weights and the broadcast). Products of 12 and
  // 16 rows, one thread, AVX2 (best of 60): 1.07-1.19× and 1.05-1.08× as fast by type
  // (Q8_0, Q4_1, Q4_K; Q6_K at 16 rows 0.98×). The interleaved x stays in blocks of 4
  // rows, so a slice of 6 reads two blocks.
  static constexpr int kRowsSliceT = kSliceT == 4 ? 6 : kSliceT;
  // One slice of NT rows from row t0 (lane = t0 % kSliceT of its interleaved block; xs:
  // that row's x in the segment, xs2: the next block's first row's). The splits compiled
  // are the ones rows_slice_any's order of slices reaches (AVX2: from lane 0 or 2); from
  // any other lane the slice would cross its block unsplit, so the rows left in the block
  // go alone instead (a guard: no order of slices here starts one there). Returns the rows
  // done.
  template <class Dec, int G, int NT>
  static int64_t rows_slice_at(const float (&qb)[G][Dec::kSegValues][16], const float (&sc)[G][32],
                               const float* xs, const float* xs2, int lane, const float* sxs,
                               int64_t nsx, float (*acc)[16], bool first) {
    const int room = kSliceT - lane;  // rows of the slice in xs's block
    if constexpr (NT <= kSliceT) {
      if (room >= NT) {
        rows_slice_q<Dec, G, NT>(qb, sc, xs, nullptr, sxs, nsx, acc, first);
        return NT;
      }
    }
    if constexpr (kRowsSliceT != kSliceT && NT > 2) {  // AVX2: from lane 0 or 2 (rows_q)
      if (room == 2) {
        rows_slice_q<Dec, G, NT, 2>(qb, sc, xs, xs2, sxs, nsx, acc, first);
        return NT;
      }
      if constexpr (NT > 4) {
        if (room == 4) {
          rows_slice_q<Dec, G, NT, 4>(qb, sc, xs, xs2, sxs, nsx, acc, first);
          return NT;
        }
      }
    }
    if (room >= 3) {
      rows_slice_q<Dec, G, 3>(qb, sc, xs, nullptr, sxs, nsx, acc, first);
      return 3;
    }
    if (room == 2) {
      rows_slice_q<Dec, G, 2>(qb, sc, xs, nullptr, sxs, nsx, acc, first);
      return 2;
    }
    rows_slice_q<Dec, G, 1>(qb, sc, xs, nullptr, sxs, nsx, acc, first);
    return 1;
  }
  // The next slice of the `left` rows still to do: kRowsSliceT rows where that leaves none
  // or at least 3, else kSliceT, else 4 or fewer (so with AVX2's slices of 6 and 4 every
  // slice but the last starts at an even row).
  template <class Dec, int G>
  static int64_t rows_slice_any(const float (&qb)[G][Dec::kSegValues][16], const float (&sc)[G][32],
                                const float* xs, const float* xs2, int lane, const float* sxs,
                                int64_t nsx, float (*acc)[16], int64_t left, bool first) {
    if constexpr (kRowsSliceT != kSliceT) {
      if (left == kRowsSliceT || left >= kRowsSliceT + 3)
        return rows_slice_at<Dec, G, kRowsSliceT>(qb, sc, xs, xs2, lane, sxs, nsx, acc, first);
    }
    if (left >= kSliceT)
      return rows_slice_at<Dec, G, kSliceT>(qb, sc, xs, xs2, lane, sxs, nsx, acc, first);
    if (left >= 4) return rows_slice_at<Dec, G, 4>(qb, sc, xs, xs2, lane, sxs, nsx, acc, first);
    if (left == 3) return rows_slice_at<Dec, G, 3>(qb, sc, xs, xs2, lane, sxs, nsx, acc, first);
    if (left == 2) return rows_slice_at<Dec, G, 2>(qb, sc, xs, xs2, lane, sxs, nsx, acc, first);
    return rows_slice_at<Dec, G, 1>(qb, sc, xs, xs2, lane, sxs, nsx, acc, first);
  }
  // T rows (kSliceT < T <= kRowsMax) of G groups, slices as rows_slice_any picks them;
  // xi: the rows' x interleaved (MatmulX::xi), row t in block t / kSliceT, lane t % kSliceT.
  static_assert(kRowsMax % kSliceT == 0);
  template <class Dec, int G>
  static void rows_q(const PackedWeight& p, int64_t g0, const float* xi, const float* sx, int64_t T,
                     float* out) {
    constexpr int SV = Dec::kSegValues;
    static_assert(Dec::kScales <= 2);
    alignas(64) float acc[G * kRowsMax][16];  // set by the first segment's slices
    alignas(64) float qb[G][SV][16];
    alignas(64) float sc[G][32];
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues, nsx = n / kXSumValues;
    const uint8_t* b[G];
    for (int g = 0; g < G; ++g) b[g] = p.group(g0 + g);
    const uintptr_t end = reinterpret_cast<uintptr_t>(b[0]) + p.group_bytes;  // of group 0
    for (int64_t blk = 0; blk < blocks; ++blk) {
      prefetch_groups<G>(b, end, p.group_bytes, bb);
      for (int s = 0; s < Dec::kSegs; ++s) {
        for (int g = 0; g < G; ++g) {
          Dec::scales(b[g], s, sc[g]);
          for (int j = 0; j < SV / Dec::kStep; ++j)
            for (int h = 0; h < H; ++h) {
              F q[Dec::kStep];
              if constexpr (requires { Dec::template qstep<true>(b[g], s, j, h, q); })
                Dec::template qstep<true>(b[g], s, j, h, q);  // the 4-bit types (nibbles)
              else
                Dec::qstep(b[g], s, j, h, q);
              for (int u = 0; u < Dec::kStep; ++u)
                V::store(qb[g][j * Dec::kStep + u] + h * N, q[u]);
            }
        }
        const int64_t seg = blk * Dec::kSegs + s;
        // The types with offsets have segments of kXSumValues, as gemv_tile_q reads sx.
        const float* sxs = Dec::kScales == 2 ? sx + seg : nullptr;
        // Block i's first row in the segment (none past the last block).
        const int64_t n_blocks = (T + kSliceT - 1) / kSliceT;
        auto block = [&](int64_t i) {
          return i < n_blocks ? xi + i * n * kSliceT + seg * SV * kSliceT : nullptr;
        };
        for (int64_t t0 = 0; t0 < T;) {
          const int64_t i = t0 / kSliceT;
          const int lane = int(t0 % kSliceT);
          t0 += rows_slice_any<Dec, G>(qb, sc, block(i) + lane, block(i + 1), lane,
                                       sxs ? sxs + t0 * nsx : nullptr, nsx, acc + t0, T - t0,
                                       seg == 0);
        }
      }
      for (int g = 0; g < G; ++g) b[g] += bb;
    }
    for (int g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t)
        store_floats(acc[g * kRowsMax + t], out + t * p.n_out + (g0 + g) * 16,
                     p.n_out - (g0 + g) * 16);
  }

  // The decode step (one token; sx: its segment sums; xq: words_x's x, or null): kGemvG
  // groups at a time.
  template <class Dec>
  static void gemv(const PackedWeight& p, int64_t g0, int64_t g1, const float* x, const float* sx,
                   const float* xq, float* out) {
    constexpr int G = V::kGemvG;
    int64_t g = g0;
    if constexpr (requires { Dec::kWords; }) {
      if (xq) {
        for (; g + G <= g1; g += G) gemv_tile_q<Dec, G, 1, true>(p, g, xq, sx, out, p.n_out);
        for (; g < g1; ++g) gemv_tile_q<Dec, 1, 1, true>(p, g, xq, sx, out, p.n_out);
        return;
      }
    }
    if constexpr (Dec::kFactored) {
      for (; g + G <= g1; g += G) gemv_tile_q<Dec, G, 1>(p, g, x, sx, out, p.n_out);
      for (; g < g1; ++g) gemv_tile_q<Dec, 1, 1>(p, g, x, sx, out, p.n_out);
    } else {
      for (; g + G <= g1; g += G) gemv_tile<Dec, G, 1>(p, g, x, out, p.n_out);
      for (; g < g1; ++g) gemv_tile<Dec, 1, 1>(p, g, x, out, p.n_out);
    }
  }

  // Groups [g0, g0 + ng) decoded into panel, group i at panel + i · n · 16, [k][16].
  template <class Dec>
  static void decode_panel(const PackedWeight& p, int64_t g0, int ng, float* panel) {
    constexpr int S = Dec::kStep, NS = Dec::kScales > 0 ? Dec::kScales : 1;
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues;
    alignas(64) float sc[NS * 16];
    for (int i = 0; i < ng; ++i) {
      const uint8_t* b = p.group(g0 + i);
      float* dst = panel + int64_t(i) * n * 16;
      for (int64_t blk = 0; blk < blocks; ++blk, b += bb)
        for (int s = 0; s < Dec::kSegs; ++s) {
          Dec::scales(b, s, sc);
          for (int j = 0; j < Dec::kSegValues / S; ++j) {
            float* d = dst + (blk * Dec::kValues + s * Dec::kSegValues + j * S) * 16;
            for (int h = 0; h < H; ++h) {
              F w[S];
              Dec::step(b, sc, s, j, h, w);
              for (int u = 0; u < S; ++u) V::store(d + u * 16 + h * N, w[u]);
            }
          }
        }
    }
  }

  // The quantized types: groups [g0, g0 + ng) as their q in panel (as decode_panel) and
  // their segments' scales in scales, group i at scales + i · (n / kSegValues) · kScales · 16,
  // [segment][kScales][16].
  template <class Dec>
  static void decode_panel_q(const PackedWeight& p, int64_t g0, int ng, float* panel,
                             float* scales) {
    constexpr int S = Dec::kStep, NS = Dec::kScales;
    const uint64_t bb = packed_layout(p.type).block_bytes;
    const int64_t n = p.n_in, blocks = n / Dec::kValues;
    for (int i = 0; i < ng; ++i) {
      const uint8_t* b = p.group(g0 + i);
      float* dst = panel + int64_t(i) * n * 16;
      float* sc = scales + int64_t(i) * (n / Dec::kSegValues) * NS * 16;
      for (int64_t blk = 0; blk < blocks; ++blk, b += bb)
        for (int s = 0; s < Dec::kSegs; ++s, sc += NS * 16) {
          Dec::scales(b, s, sc);
          for (int j = 0; j < Dec::kSegValues / S; ++j) {
            float* d = dst + (blk * Dec::kValues + s * Dec::kSegValues + j * S) * 16;
            for (int h = 0; h < H; ++h) {
              F q[S];
              Dec::qstep(b, s, j, h, q);
              for (int u = 0; u < S; ++u) V::store(d + u * 16 + h * N, q[u]);
            }
          }
        }
    }
  }

  // One register tile of the quantized types' panel kernel: what it reads.
  struct QTile {
    const float* panel;  // group g's q at panel + g · ps, [n][16]
    int64_t ps;
    const float* scales;  // group g's segment scales at scales + g · ss, [n / SV][NS][16]
    int64_t ss;
    const float* xp;  // the tokens' x transposed, [n][kTileT]
    const float* sx;  // token t's segment sums at sx + t · nsx (types with offsets)
    int64_t nsx, n;
  };

  // TG groups × NT tokens of the quantized types, segment by segment with gemv_tile_q's
  // arithmetic: s_q over the segment's SV values, then the scales.
  template <int SV, int NS, int TG, int NT>
  static void tile_q(const QTile& a, float* out, int64_t ldo, int64_t valid) {
    constexpr int TT = V::kTileT;
    alignas(64) float acc[TG][NT][16] = {};
    for (int64_t k0 = 0, seg = 0; k0 < a.n; k0 += SV, ++seg) {
      F sq[TG][NT][H];
      for (int g = 0; g < TG; ++g)
        for (int t = 0; t < NT; ++t)
          for (int h = 0; h < H; ++h) sq[g][t][h] = V::zero();
#pragma GCC unroll 2
      for (int64_t k = k0; k < k0 + SV; ++k) {
        F w[TG][H];
        for (int g = 0; g < TG; ++g)
          for (int h = 0; h < H; ++h) w[g][h] = V::load(a.panel + g * a.ps + k * 16 + h * N);
        for (int t = 0; t < NT; ++t) {
          const F xb = V::bcast(a.xp + k * TT + t);
          for (int g = 0; g < TG; ++g)
            for (int h = 0; h < H; ++h) sq[g][t][h] = V::fma(w[g][h], xb, sq[g][t][h]);
        }
      }
      for (int g = 0; g < TG; ++g) {
        const float* sc = a.scales + g * a.ss + seg * NS * 16;
        for (int t = 0; t < NT; ++t)
          for (int h = 0; h < H; ++h) {
            F v = V::fma(V::load(sc + h * N), sq[g][t][h], V::load(acc[g][t] + h * N));
            if constexpr (NS == 2)
              v = V::fma(V::load(sc + 16 + h * N), V::bcast(a.sx + t * a.nsx + seg), v);
            V::store(acc[g][t] + h * N, v);
          }
      }
    }
    for (int g = 0; g < TG; ++g)
      for (int t = 0; t < NT; ++t) store_floats(acc[g][t], out + t * ldo + g * 16, valid - g * 16);
  }

  template <int SV, int NS, int TG, int... Ts>
  static void tile_q_tokens(int nt, const QTile& a, float* out, int64_t ldo, int64_t valid,
                            std::integer_sequence<int, Ts...>) {
    ((nt == Ts + 1 ? tile_q<SV, NS, TG, Ts + 1>(a, out, ldo, valid) : void()), ...);
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

  // The rows kernel's x (MatmulX::xi): x [T][n] interleaved by slices of kSliceT rows,
  // slice i at xi + i · n · kSliceT, [n][kSliceT] (a last slice's missing rows left
  // unset); and, where sx, the rows' segment sums, bit for bit segment_sums' (kernels.h):
  // each row's 32 values added in order from 0, here kSliceT rows side by side from xi.
  static void interleave_x(const float* x, int64_t T, int64_t n, float* xi, float* sx) {
    constexpr int ST = kSliceT, SV = kXSumValues;
    const int64_t segs = n / SV;
    for (int64_t t0 = 0; t0 < T; t0 += ST) {
      float* dst = xi + t0 * n;
      const float* src = x + t0 * n;
      const int nt = int(std::min<int64_t>(ST, T - t0));
      int64_t k = 0;
      if constexpr (requires { V::transpose(x, n, xi); }) {
        static_assert(V::kTransposeT == ST);
        if (nt == ST)
          for (; k + ST <= n; k += ST) V::transpose(src + k, n, dst + k * ST);
      }
      for (; k < n; ++k)
        for (int t = 0; t < nt; ++t) dst[k * ST + t] = src[t * n + k];
      if (!sx) continue;
      if (nt < ST) {
        segment_sums(src, nt, n, sx + t0 * segs);
        continue;
      }
      thread_local ScratchFloats sum_buf;  // [segs][ST]
      sum_buf.reserve(size_t(segs) * ST);
      float* sums = sum_buf.data();
      if constexpr (requires { V::transposed_sums(dst, segs, sums); }) {
        V::transposed_sums(dst, segs, sums);
      } else {
        for (int64_t s = 0; s < segs; ++s)
          for (int t = 0; t < ST; ++t) {
            float sum = 0.0f;
            for (int j = 0; j < SV; ++j) sum += dst[(s * SV + j) * ST + t];
            sums[s * ST + t] = sum;
          }
      }
      for (int t = 0; t < ST; ++t)
        for (int64_t s = 0; s < segs; ++s) sx[(t0 + t) * segs + s] = sums[s * ST + t];
    }
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

  // sx: the segment sums of all T tokens, token t at sx + t · n / kXSumValues.
  template <class Dec>
  static void panel(const PackedWeight& p, int64_t g0, int64_t g1, const float* xp, const float* sx,
                    int64_t T, float* out) {
    constexpr int TG = V::kTileG, TT = V::kTileT;
    const int64_t n = p.n_in, ps = n * 16;
    // Groups per panel: about 192 KiB of decoded weights (stays in L2 while the tokens
    // sweep it), a multiple of the tile height.
    const int64_t fit = std::max<int64_t>(TG, (int64_t(192) << 10) / (ps * 4)) / TG * TG;
    const int64_t pg = std::min<int64_t>(fit, 16);
    thread_local ScratchFloats buf, sbuf;
    buf.reserve(size_t(pg * ps));
    constexpr int NS = Dec::kScales > 0 ? Dec::kScales : 1;
    const int64_t ss = n / Dec::kSegValues * NS * 16;  // one group's segment scales
    if constexpr (Dec::kFactored) sbuf.reserve(size_t(pg * ss));
    for (int64_t q0 = g0; q0 < g1; q0 += pg) {
      const int ng = int(std::min(pg, g1 - q0));
      if constexpr (Dec::kFactored) {
        decode_panel_q<Dec>(p, q0, ng, buf.data(), sbuf.data());
      } else {
        decode_panel<Dec>(p, q0, ng, buf.data());
      }
      for (int64_t t = 0; t < T; t += TT) {
        const int nt = int(std::min<int64_t>(TT, T - t));
        for (int g = 0; g < ng; g += TG) {
          const float* pan = buf.data() + g * ps;
          float* o = out + t * p.n_out + (q0 + g) * 16;
          const int64_t valid = p.n_out - (q0 + g) * 16;
          const float* xt = xp + (t / TT) * n * TT;
          const bool full = g + TG <= ng;
          if constexpr (Dec::kFactored) {
            const int64_t nsx = n / kXSumValues;
            const QTile a{pan, ps, sbuf.data() + g * ss, ss, xt, sx + t * nsx, nsx, n};
            constexpr auto seq = std::make_integer_sequence<int, TT>{};
            if (full) {
              tile_q_tokens<Dec::kSegValues, NS, TG>(nt, a, o, p.n_out, valid, seq);
            } else {
              tile_q_tokens<Dec::kSegValues, NS, 1>(nt, a, o, p.n_out, valid, seq);
            }
          } else if (full) {
            tile_any<TG>(nt, pan, ps, xt, n, o, p.n_out, valid);
          } else {
            tile_any<1>(nt, pan, ps, xt, n, o, p.n_out, valid);
          }
        }
      }
    }
  }

  // With 2 groups × 8 rows a tile (AVX-512), the quantized types take these tiles at
  // every T: the tiles' weights stay in L1 while the rows stream past, and decoding them
  // again for each 8 rows costs less than the panel's fp32 copy (12% less CPU time for
  // the default model's products at 64 and 512 rows). With AVX2's 1 group × 4 rows the
  // panel is faster past kGemvSlicesMaxT rows.
  static constexpr bool kQuantizedGemvAnyT = kSliceG == 2;
  // Whether a product of T rows of weight type t takes the panel kernel (and so reads x
  // transposed, MatmulX::xt): past kGemvSlicesMaxT rows, except the quantized types where
  // kQuantizedGemvAnyT. The one rule for run() below and for matmul.cpp's transpose.
  static bool is_float_type(GgmlType t) {
    return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
  }
  static bool uses_panel(GgmlType t, int64_t T) {
    return T > kGemvSlicesMaxT && !(kQuantizedGemvAnyT && !is_float_type(t));
  }
  // Whether it takes rows_q, which reads MatmulX::xi: the quantized types past one slice.
  static bool uses_rows(GgmlType t, int64_t T) {
    return T > kSliceT && !is_float_type(t) && !uses_panel(t, T);
  }
  template <class Dec, int G, int NT>
  static void slice_tile(const PackedWeight& p, int64_t g, const float* x, const float* sx,
                         const float* xq, float* out) {
    if constexpr (requires { Dec::kWords; }) {
      if (xq) {
        gemv_tile_q<Dec, G, NT, true>(p, g, xq, sx, out, p.n_out);
        return;
      }
    }
    if constexpr (Dec::kFactored) {
      gemv_tile_q<Dec, G, NT>(p, g, x, sx, out, p.n_out);
    } else {
      gemv_tile<Dec, G, NT>(p, g, x, out, p.n_out);
    }
  }
  template <class Dec, int G>
  static void slices(const PackedWeight& p, int64_t g, const MatmulX& in, float* out) {
    const int64_t nsx = p.n_in / kXSumValues;
    if constexpr (Dec::kFactored) {
      // Where matmul took the rows kernel (uses_rows and rows_kernel_on; it set xi): each
      // segment decoded once for up to kRowsMax rows.
      if (in.xi) {
        for (int64_t t0 = 0; t0 < in.T; t0 += kRowsMax)
          rows_q<Dec, G>(p, g, in.xi + t0 * p.n_in, in.sx ? in.sx + t0 * nsx : nullptr,
                         std::min<int64_t>(kRowsMax, in.T - t0), out + t0 * p.n_out);
        return;
      }
    }
    for (int64_t t0 = 0; t0 < in.T;) {
      const float* xs = in.x + t0 * p.n_in;
      const float* xq = in.xq ? in.xq + t0 * p.n_in : nullptr;
      const float* ss = in.sx ? in.sx + t0 * nsx : nullptr;
      float* os = out + t0 * p.n_out;
      const int64_t n = std::min<int64_t>(in.T - t0 >= kSliceT ? kSliceT : 4, in.T - t0);
      if (n == kSliceT) {
        slice_tile<Dec, G, kSliceT>(p, g, xs, ss, xq, os);
      } else if (n == 4) {
        slice_tile<Dec, G, 4>(p, g, xs, ss, xq, os);
      } else if (n == 3) {
        slice_tile<Dec, G, 3>(p, g, xs, ss, xq, os);
      } else if (n == 2) {
        slice_tile<Dec, G, 2>(p, g, xs, ss, xq, os);
      } else {
        slice_tile<Dec, G, 1>(p, g, xs, ss, xq, os);
      }
      t0 += n;
    }
  }
  template <class Dec>
  static void gemv_slices(const PackedWeight& p, int64_t g0, int64_t g1, const MatmulX& in,
                          float* out) {
    int64_t g = g0;
    for (; g + kSliceG <= g1; g += kSliceG) slices<Dec, kSliceG>(p, g, in, out);
    for (; g < g1; ++g) slices<Dec, 1>(p, g, in, out);
  }

  template <class Dec>
  static void run(const PackedWeight& p, int64_t g0, int64_t g1, const MatmulX& in, float* out) {
    if (in.T == 1) {  // the decode step: kGemvG groups at a time
      gemv<Dec>(p, g0, g1, in.x, in.sx, in.xq, out);
      return;
    }
    if (!uses_panel(p.type, in.T)) {
      gemv_slices<Dec>(p, g0, g1, in, out);
      return;
    }
    panel<Dec>(p, g0, g1, in.xt, in.sx, in.T, out);
  }

  // Row groups [g0, g1) of out [T][p.n_out] = x [T][p.n_in] · Wᵀ.
  static void matmul_groups(const PackedWeight& p, int64_t g0, int64_t g1, const MatmulX& in,
                            float* out) {
    switch (p.type) {
      case GgmlType::F32:
        run<PackFloat<V, 4, LoadF32<V>>>(p, g0, g1, in, out);
        return;
      case GgmlType::F16:
        run<PackFloat<V, 2, LoadF16<V>>>(p, g0, g1, in, out);
        return;
      case GgmlType::BF16:
        run<PackFloat<V, 2, LoadBF16<V>>>(p, g0, g1, in, out);
        return;
      case GgmlType::Q8_0:
        run<PackQ8_0<V>>(p, g0, g1, in, out);
        return;
      case GgmlType::Q4_0:
        if (p.nibbles == NibbleOrder::Words) {
          run<PackQ4W<V, false>>(p, g0, g1, in, out);
        } else {
          run<PackQ4<V, false>>(p, g0, g1, in, out);
        }
        return;
      case GgmlType::Q4_1:
        if (p.nibbles == NibbleOrder::Words) {
          run<PackQ4W<V, true>>(p, g0, g1, in, out);
        } else {
          run<PackQ4<V, true>>(p, g0, g1, in, out);
        }
        return;
      case GgmlType::Q5_0:
        run<PackQ5<V, false>>(p, g0, g1, in, out);
        return;
      case GgmlType::Q5_1:
        run<PackQ5<V, true>>(p, g0, g1, in, out);
        return;
      case GgmlType::Q4_K:
        if (p.nibbles == NibbleOrder::Words) {
          run<PackQ4_KW<V>>(p, g0, g1, in, out);
        } else {
          run<PackQ4_K<V>>(p, g0, g1, in, out);
        }
        return;
      case GgmlType::Q5_K:
        run<PackQ5_K<V>>(p, g0, g1, in, out);
        return;
      case GgmlType::Q6_K:
        run<PackQ6_K<V>>(p, g0, g1, in, out);
        return;
      default:
        return;  // pack_weight accepts no other type
    }
  }
};

}  // namespace
}  // namespace kvscope::cpu
