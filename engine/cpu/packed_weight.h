// packed_weight.h — weights re-laid out for the CPU kernels: 16 rows interleaved.
//
// The CPU kernels compute out[t][o] = Σ_k W[o][k]·x[t][k] sixteen output rows at a time,
// one vector lane per row, adding k = 0, 1, 2, ... in order (engine/cpu/kernels_impl.h).
// They therefore read W "column-wise": for each k, the values of sixteen rows. A packed
// weight stores the same quantized data in that order, once, when the backend first uses
// the weight. Still quantized: a Q4 weight stays 4 bits per value.
//
// Rows are taken in groups of kPackRows (a last partial group is padded with zero rows);
// a group holds its blocks along k back to back, each block holding the 16 rows' fields
// in the order below (R = 16, "[a][R]" = a values for each of the 16 rows, row fastest):
//   F32   per k: [R] fp32                         F16, BF16  per k: [R] 16-bit
//   Q8_0  32 k:  d[R] f16, q[32][R] int8
//   Q4_0  32 k:  d[R] f16, q[16][R] u8 (low nibble value k = 2p, high nibble k = 2p+1)
//   Q4_1  32 k:  d[R], m[R] f16, q[16][R] as Q4_0
//   Q5_0  32 k:  d[R], q[16][R] low 4 bits as Q4_0, h[32] u16 (bit r = bit 4 of row r)
//   Q5_1  32 k:  d[R], m[R], q[16][R], h[32]
//   Q4_K 256 k:  d[R], dmin[R] f16, sc[8][R], mn[8][R] u8 (the 6-bit scales and mins of
//                the eight 32-value sub-blocks), q[128][R] as Q4_0
//   Q5_K 256 k:  as Q4_K, then h[256] u16 (bit r = bit 4 of value k of row r)
//   Q6_K 256 k:  d[R] f16, sc[16][R] int8 (one per 16 values), q[256][R] int8 (q6 − 32)
// Q6_K grows from 6.6 to 8.6 bits per value (bytes decode faster than bit fields); the
// other types keep their size.
//
// Q4_0, Q4_1 and Q4_K have a second order of their 4-bit values, NibbleOrder::Words, in
// the same bytes: runs of 8 consecutive values of a row, q[i][R] as little-endian u32
// (value 8i + p in bits 4p..4p+3; Q4_K: run i of the block's 32). From a word, one mask
// gives value p times 2^4p, which the single-token product converts and multiplies by
// x·2^-4p (kernels_impl.h, "words"): two vector operations per 8 values of 8 or 16 rows,
// where the byte order takes a widening load, a mask or shift and a convert per 2.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/cpu/thread_pool.h"
#include "engine/model.h"

namespace kvscope::cpu {

constexpr int kPackRows = 16;

enum class NibbleOrder : uint8_t { Bytes, Words };
// Whether type t has the Words order (Q4_0, Q4_1, Q4_K).
bool has_nibble_words(GgmlType t);
// The order measured faster for the active instruction set on this CPU: Words on AVX2 on
// AMD cores (Zen 3: the Q4_1 single-token product 1.15x as fast in cache, 1.06x from
// memory, the other products within 2%) and on AVX-512 on Zen 4 (there the Q4_1
// single-token product 1.16-1.22x as fast in cache, 1.0-1.07x from memory, and decode
// 1.05-1.09x; docs/performance.md), Bytes elsewhere (AVX-512 on Intel and on Zen 5
// decodes the byte order with a table lookup; on Intel's AVX2 a word layout measured
// slower).
NibbleOrder preferred_nibble_order();

struct PackedLayout {
  int block_values = 0;      // k values per block
  uint64_t block_bytes = 0;  // bytes of one block of 16 rows
};
// Layout of a type; block_values == 0 for types the kernels do not support.
PackedLayout packed_layout(GgmlType t);

struct PackedWeight {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;    // k
  int64_t n_out = 0;   // rows
  int64_t groups = 0;  // ceil(n_out / 16)
  uint64_t group_bytes = 0;
  NibbleOrder nibbles = NibbleOrder::Bytes;  // Words only where has_nibble_words(type)
  std::unique_ptr<uint8_t[], void (*)(void*)> data{nullptr, nullptr};  // 64-byte aligned
  const uint8_t* group(int64_t g) const { return data.get() + uint64_t(g) * group_bytes; }
};

// Packs w (any type type_supported() accepts, n_in a multiple of its block size); the
// groups are packed in parallel on `pool`. nullptr when out of memory. Every instruction
// set's kernels read either order; the first form takes preferred_nibble_order().
std::unique_ptr<PackedWeight> pack_weight(const Weight& w, ThreadPool& pool);
std::unique_ptr<PackedWeight> pack_weight(const Weight& w, ThreadPool& pool, NibbleOrder order);

}  // namespace kvscope::cpu
