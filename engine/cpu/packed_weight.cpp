// packed_weight.cpp — the 16-row interleaved weight layout (see packed_weight.h).
//
// Plain scalar code: every source field is read with memcpy (rows need no alignment)
// and written to its packed place; nothing is converted, so a packed weight holds
// exactly the numbers of the file.
#include "engine/cpu/packed_weight.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/cpu/cpu_isa.h"
#include "engine/quant.h"

namespace kvscope::cpu {
namespace {

constexpr int R = kPackRows;

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 4-bit value k (0..31) of a Q4_0/Q4_1/Q5 payload: low nibble of byte k for k < 16,
// high nibble of byte k - 16 otherwise.
inline int nib32(const uint8_t* qs, int k) {
  return k < 16 ? qs[k] & 0xF : qs[k - 16] >> 4;
}

// Value k (0..255) of a Q4_K block's 4-bit payload.
inline int nib_q4k(const uint8_t* qs, int k) {
  const int g = k / 64, l = k % 32;
  return (k % 64) < 32 ? qs[32 * g + l] & 0xF : qs[32 * g + l] >> 4;
}

// Value k (0..255) of a Q6_K block as q6 − 32.
inline int q6k_value(const uint8_t* b, int k) {
  const int n = k / 128, q = (k % 128) / 32, l = k % 32;
  const uint8_t* ql = b + 64 * n;
  const uint8_t* qh = b + 128 + 32 * n;
  const int lo = q < 2 ? ql[l + 32 * (q & 1)] & 0xF : ql[l + 32 * (q & 1)] >> 4;
  const int hi = (qh[l] >> (2 * q)) & 3;
  return (lo | (hi << 4)) - 32;
}

// The 6-bit scale and min of Q4_K sub-block s (0..7).
inline void q4k_scale_min(const uint8_t* sc, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// Packs block b of row i (0..15) of a group: src is that row's block, dst the group's
// packed block.
// Words order (packed_weight.h): run r of 8 values, value(k) the k-th 4-bit value, into
// the 16 rows' words at q (row i's at q + 4·(r·R + i)).
template <class Value>
void pack_words(int runs, Value value, int i, uint8_t* q) {
  for (int r = 0; r < runs; ++r) {
    uint32_t w = 0;
    for (int p = 0; p < 8; ++p) w |= uint32_t(value(8 * r + p)) << (4 * p);
    std::memcpy(q + 4 * (r * R + i), &w, 4);
  }
}

void pack_block(GgmlType t, const uint8_t* src, int i, uint8_t* dst, bool words) {
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst + 4 * i, src, 4);
      return;
    case GgmlType::F16:
    case GgmlType::BF16:
      std::memcpy(dst + 2 * i, src, 2);
      return;
    // Q8_0, Q4_0 and Q4_1: a whole group at a time (pack_group_block below).
    case GgmlType::Q5_0:
    case GgmlType::Q5_1: {
      const bool has_m = t == GgmlType::Q5_1;
      std::memcpy(dst + 2 * i, src, 2);
      if (has_m) std::memcpy(dst + 32 + 2 * i, src + 2, 2);
      const uint32_t h = u32_at(src + (has_m ? 4 : 2));
      const uint8_t* qs = src + (has_m ? 8 : 6);
      uint8_t* q = dst + (has_m ? 64 : 32);
      for (int p = 0; p < 16; ++p)
        q[p * R + i] = uint8_t(nib32(qs, 2 * p) | (nib32(qs, 2 * p + 1) << 4));
      uint8_t* hb = q + 16 * R;
      for (int k = 0; k < 32; ++k)
        if ((h >> k) & 1u) hb[2 * k + i / 8] |= uint8_t(1u << (i % 8));
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {  // Q5_K: Q4_K's fields, its nibbles past qh[32], then the bits
      const bool q5 = t == GgmlType::Q5_K;
      std::memcpy(dst + 2 * i, src, 2);
      std::memcpy(dst + 32 + 2 * i, src + 2, 2);
      for (int s = 0; s < 8; ++s) {
        int scale, min;
        q4k_scale_min(src + 4, s, &scale, &min);
        dst[64 + s * R + i] = uint8_t(scale);
        dst[64 + 128 + s * R + i] = uint8_t(min);
      }
      const uint8_t* qs = src + (q5 ? 48 : 16);
      uint8_t* q = dst + 64 + 256;
      if (words) {  // Q4_K only (has_nibble_words)
        pack_words(
            32, [&](int k) { return nib_q4k(qs, k); }, i, q);
        return;
      }
      for (int p = 0; p < 128; ++p)
        q[p * R + i] = uint8_t(nib_q4k(qs, 2 * p) | (nib_q4k(qs, 2 * p + 1) << 4));
      if (!q5) return;
      const uint8_t* qh = src + 16;
      uint8_t* hb = q + 128 * R;
      for (int k = 0; k < 256; ++k)
        if ((qh[k % 32] >> (k / 32)) & 1) hb[2 * k + i / 8] |= uint8_t(1u << (i % 8));
      return;
    }
    case GgmlType::Q6_K: {
      std::memcpy(dst + 2 * i, src + 208, 2);
      for (int j = 0; j < 16; ++j) dst[32 + j * R + i] = src[192 + j];
      for (int k = 0; k < 256; ++k) dst[32 + 256 + k * R + i] = uint8_t(int8_t(q6k_value(src, k)));
      return;
    }
    default:
      return;
  }
}

inline uint64_t u64_at(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// The low nibbles of the 8 bytes of v as 8 values of 4 bits, byte 0's lowest: the 32-bit
// word n0 | n1 << 4 | ... | n7 << 28.
inline uint32_t nibbles_of(uint64_t v) {
  v &= 0x0F0F0F0F0F0F0F0Full;
  v = (v | (v >> 4)) & 0x00FF00FF00FF00FFull;
  v = (v | (v >> 8)) & 0x0000FFFF0000FFFFull;
  return uint32_t(v | (v >> 16));
}

// m[r] byte c becomes m[c] byte r (an 8 x 8 byte transpose: the off-diagonal halves,
// quarters and bytes swapped in turn).
inline void transpose8x8(uint64_t m[8]) {
  for (int r = 0; r < 4; ++r) {
    const uint64_t t = ((m[r] >> 32) ^ m[r + 4]) & 0x00000000FFFFFFFFull;
    m[r] ^= t << 32;
    m[r + 4] ^= t;
  }
  for (int r : {0, 1, 4, 5}) {
    const uint64_t t = ((m[r] >> 16) ^ m[r + 2]) & 0x0000FFFF0000FFFFull;
    m[r] ^= t << 16;
    m[r + 2] ^= t;
  }
  for (int r = 0; r < 8; r += 2) {
    const uint64_t t = ((m[r] >> 8) ^ m[r + 1]) & 0x00FF00FF00FF00FFull;
    m[r] ^= t << 8;
    m[r + 1] ^= t;
  }
}

// The 16 rows' 8N bytes in[i] as the field [8N][R] at dst: byte k of row i at dst[k·R + i].
template <int N>
void interleave_rows(const uint64_t (&in)[R][N], uint8_t* dst) {
  for (int h = 0; h < R / 8; ++h)
    for (int w = 0; w < N; ++w) {
      uint64_t m[8];
      for (int r = 0; r < 8; ++r) m[r] = in[8 * h + r][w];
      transpose8x8(m);
      for (int c = 0; c < 8; ++c) std::memcpy(dst + (8 * w + c) * R + 8 * h, &m[c], 8);
    }
}

// Block b of a whole group at once for Q8_0, Q4_0 and Q4_1, the types of most models'
// weights: the layout of packed_weight.h, moved 8 bytes at a time (a 576 x 1,536 weight
// packs 2.2x as fast in Q4_1 and 3.9x in Q8_0 on one thread as row by row did, and more so
// under AddressSanitizer, which checks every access). rows[i] is row i's block, null past
// the last row (its bytes stay zero).
bool pack_group_block(GgmlType t, const uint8_t* const* rows, uint8_t* dst, bool words) {
  if (t == GgmlType::Q8_0) {
    uint64_t q[R][4] = {};
    for (int i = 0; i < R; ++i) {
      if (!rows[i]) continue;
      std::memcpy(dst + 2 * i, rows[i], 2);
      for (int w = 0; w < 4; ++w) q[i][w] = u64_at(rows[i] + 2 + 8 * w);
    }
    interleave_rows(q, dst + 2 * R);
    return true;
  }
  if (t != GgmlType::Q4_0 && t != GgmlType::Q4_1) return false;
  const int head = t == GgmlType::Q4_0 ? 2 : 4;  // bytes of d (and m)
  uint8_t* q = dst + head * R;
  uint64_t bytes[R][2] = {};
  for (int i = 0; i < R; ++i) {
    if (!rows[i]) continue;
    const uint8_t* src = rows[i];
    std::memcpy(dst + 2 * i, src, 2);
    if (head == 4) std::memcpy(dst + 2 * R + 2 * i, src + 2, 2);
    // Values 0..15 are the low nibbles of the 16 payload bytes, 16..31 the high ones.
    const uint64_t x0 = u64_at(src + head), x1 = u64_at(src + head + 8);
    const uint32_t v[4] = {nibbles_of(x0), nibbles_of(x1), nibbles_of(x0 >> 4),
                           nibbles_of(x1 >> 4)};  // values 8r .. 8r + 7
    if (words) {
      for (int r = 0; r < 4; ++r) std::memcpy(q + 4 * (r * R + i), &v[r], 4);
    } else {  // byte p: values 2p and 2p + 1, which a run's word holds in that order
      bytes[i][0] = v[0] | uint64_t(v[1]) << 32;
      bytes[i][1] = v[2] | uint64_t(v[3]) << 32;
    }
  }
  if (!words) interleave_rows(bytes, q);
  return true;
}

}  // namespace

PackedLayout packed_layout(GgmlType t) {
  switch (t) {
    case GgmlType::F32:
      return {1, 4 * R};
    case GgmlType::F16:
    case GgmlType::BF16:
      return {1, 2 * R};
    case GgmlType::Q8_0:
      return {32, 2 * R + 32 * R};
    case GgmlType::Q4_0:
      return {32, 2 * R + 16 * R};
    case GgmlType::Q4_1:
      return {32, 4 * R + 16 * R};
    case GgmlType::Q5_0:
      return {32, 2 * R + 16 * R + 64};
    case GgmlType::Q5_1:
      return {32, 4 * R + 16 * R + 64};
    case GgmlType::Q4_K:
      return {256, 4 * R + 16 * R + 128 * R};
    case GgmlType::Q5_K:
      return {256, 4 * R + 16 * R + 128 * R + 512};
    case GgmlType::Q6_K:
      return {256, 2 * R + 16 * R + 256 * R};
    default:
      return {0, 0};
  }
}

bool has_nibble_words(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q4_K;
}

NibbleOrder preferred_nibble_order() {
  const unsigned family = amd_cpu_family();  // 0: not AMD
  const Isa isa = isa_active();
  if (family != 0 && isa == Isa::Avx2) return NibbleOrder::Words;
  if (isa == Isa::Avx512 && family == 0x19) return NibbleOrder::Words;  // Zen 4
  return NibbleOrder::Bytes;
}

std::unique_ptr<PackedWeight> pack_weight(const Weight& w, ThreadPool& pool) {
  return pack_weight(w, pool, preferred_nibble_order());
}

std::unique_ptr<PackedWeight> pack_weight(const Weight& w, ThreadPool& pool, NibbleOrder order) {
  const PackedLayout lay = packed_layout(w.type);
  const TypeTraits* tt = type_traits(w.type);
  if (lay.block_values == 0 || !tt || w.n_in % lay.block_values != 0) return nullptr;
  auto p = std::make_unique<PackedWeight>();
  p->type = w.type;
  p->n_in = w.n_in;
  p->n_out = w.n_out;
  p->groups = (w.n_out + R - 1) / R;
  p->nibbles = has_nibble_words(w.type) ? order : NibbleOrder::Bytes;
  const bool words = p->nibbles == NibbleOrder::Words;
  const int64_t blocks = w.n_in / lay.block_values;
  p->group_bytes = uint64_t(blocks) * lay.block_bytes;
  const uint64_t total =
      std::max<uint64_t>(64, (p->group_bytes * uint64_t(p->groups) + 63) / 64 * 64);
  p->data = {static_cast<uint8_t*>(std::aligned_alloc(64, total)), std::free};
  if (!p->data) return nullptr;
  const uint64_t src_block = tt->type_size * (uint64_t(lay.block_values) / tt->block_size);
  pool.parallel_for(p->groups, [&](int64_t g0, int64_t g1) {
    std::memset(p->data.get() + uint64_t(g0) * p->group_bytes, 0,
                uint64_t(g1 - g0) * p->group_bytes);
    for (int64_t g = g0; g < g1; ++g) {
      uint8_t* dst = p->data.get() + uint64_t(g) * p->group_bytes;
      const uint8_t* rows[R];
      for (int i = 0; i < R; ++i)
        rows[i] = g * R + i < w.n_out ? w.data + uint64_t(g * R + i) * w.row_bytes : nullptr;
      if (pack_group_block(w.type, rows, dst, words)) {
        for (int64_t b = 1; b < blocks; ++b) {
          for (int i = 0; i < R; ++i)
            if (rows[i]) rows[i] += src_block;
          pack_group_block(w.type, rows, dst + uint64_t(b) * lay.block_bytes, words);
        }
        continue;
      }
      for (int i = 0; i < R && rows[i]; ++i)
        for (int64_t b = 0; b < blocks; ++b)
          pack_block(w.type, rows[i] + uint64_t(b) * src_block, i,
                     dst + uint64_t(b) * lay.block_bytes, words);
    }
  });
  return p;
}

}  // namespace kvscope::cpu
