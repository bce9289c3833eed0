// kernels.h — the CPU kernels of one instruction set, as a table of entry points.
//
// engine/cpu/kernels_{avx512,avx2,scalar}.cpp each build the table from the generic
// kernels (kernels_impl.h, attention_impl.h, act_impl.h, rows_impl.h) for their
// instruction set; kernels(isa) returns it. Callers pick the table once per operation
// with kernels(isa_active()). Every vector instruction of the CPU backend is in those
// three files: the rest of the engine is portable C++, and engine/quant.cpp is the scalar
// reference of the row operations below.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/packed_weight.h"
#include "engine/gguf.h"
#include "engine/kv_cache.h"

namespace kvscope::cpu {

// Attention keys are processed in chunks by position: chunk c holds positions
// [c·kAttnChunk, (c+1)·kAttnChunk) (further cut where the visible keys have a gap), so
// a query's arithmetic depends on the positions it sees, never on the batch or threads.
constexpr int kAttnChunk = 128;

// One chunk of keys for one query and the G heads of one KV group (attention_impl.h).
struct AttnChunk {
  const float* q;         // [G][D]: the query's heads of the group
  const uint8_t* k_base;  // K row of slot s: k_base + s · k_row_bytes (this KV head)
  const uint8_t* v_base;  // V likewise
  uint64_t k_row_bytes = 0, v_row_bytes = 0;
  KvDtype k_type = KvDtype::F16, v_type = KvDtype::F16;
  const int32_t* slots;  // [n] the chunk's keys, ascending position
  int n = 0;             // 1 .. kAttnChunk
  int n_after = 0;       // slots[n, n + n_after) follow in the same order (prefetch only)
  int D = 0, G = 0;
  float* e;    // out [G][kAttnChunk]: exp(score − m[g]), 0 past n
  float* m;    // out [G]: the chunk's highest score per head
  float* sum;  // out [G]: Σ e
  float* acc;  // out [G][D]: Σ e_j · v_j, keys in order
};

// Combining the chunks of one query and KV group (attention_impl.h).
struct AttnCombine {
  int G = 0, D = 0, n_chunks = 0;
  const float* parts;  // chunk c's results at parts + c · stride: e [G][kAttnChunk], m [G],
  size_t stride = 0;   //   sum [G], acc [G][D]
  float* out;          // [G][D]: the group's heads in the output row
  float* probs;        // head g's attention row at probs + g · probs_cols, or null
  int64_t probs_cols = 0;
  const int32_t* chunk_begin;  // [n_chunks] first position of each chunk (positions in a
  const int32_t* chunk_n;      // [n_chunks] chunk are consecutive) and its number of keys
};

// Products of up to this many rows (one decode step, or a batch of decode rows) stream
// the weights (gemv, over tiles of a few rows); more rows use the panel kernel, which
// reads x transposed by transpose_x. At these T, decoding each weight group once per tile
// of rows in registers beats decoding it once into an fp32 panel and reading that back.
constexpr int kGemvSlicesMaxT = 16;

// Weight types with an offset per segment (Q4_1, Q5_1, Q4_K, Q5_K) add m·Σx once per
// segment of this many values rather than m·x per value: the sums of x over each segment,
// per token (segment_sums, below), made once per product and shared by every row.
constexpr int kXSumValues = 32;

// sx[t][s] = x[t][32s] + x[t][32s + 1] + ... + x[t][32s + 31], added in that order from
// 0 in fp32, for s < n / 32 (kXSumValues): the per-segment sums of x that the products of
// the weight types with offsets use (kernels_impl.h). sx holds T · (n / 32) floats.
// Defined in matmul.cpp, outside the per-instruction-set files, which call it too.
void segment_sums(const float* x, int64_t T, int64_t n, float* sx);

// Weights packed with NibbleOrder::Words (packed_weight.h): value p of a word (k = 8i + p)
// comes out of its mask as q·2^word_shift(p) (the last one by a shift, as q), and is
// multiplied by x[k]·2^-word_shift(p): the same product q·x, so the same multiply-add
// result, bit for bit, wherever x[k]·2^-word_shift(p) is exact. It is unless x[k] is
// nonzero and below 2^-98 in magnitude (below the normal range once scaled): a product
// whose x has such a value decodes q exactly instead (words_x).
constexpr int word_shift(int p) {
  return p == 7 ? 0 : 4 * p;
}
// xq[t][k] = x[t][k]·2^-word_shift(k % 8) for a product with n a multiple of 8; false
// (xq then unusable) when some value would not scale exactly.
// Defined in matmul.cpp.
bool words_x(const float* x, int64_t T, int64_t n, float* xq);

// The x side of one product, shared by every call of it.
struct MatmulX {
  const float* x;   // [T][n]
  const float* xt;  // x as transpose_x lays it out, for the panel kernel; else unused
  const float* sx;  // [T][n / kXSumValues] segment sums, for the types with offsets; else unused
  int64_t T;
  const float* xi;  // x as interleave_x lays it out, for the rows kernel; else unused
  // x as words_x lays it out, for the gemv tiles on Words-ordered weights; null where no
  // job needs it or x does not scale exactly (those tiles then decode q exactly)
  const float* xq = nullptr;
};

struct IsaKernels {
  Isa isa;
  // Row groups [g0, g1) (16 rows each) of out [T][w.n_out] = x [T][w.n_in] · Wᵀ; see
  // kernels_impl.h for the fixed arithmetic.
  void (*matmul_groups)(const PackedWeight& w, int64_t g0, int64_t g1, const MatmulX& in,
                        float* out);
  // Whether a product of T rows of weight type t takes the panel kernel, which reads
  // MatmulX::xt; else the gemv tiles, which read no xt. Past kGemvSlicesMaxT rows, except
  // the quantized types on AVX-512 (32 registers hold a tile of 2 groups × 8 rows, which
  // beats decoding the weights into a panel even for a long prefill).
  bool (*uses_panel)(GgmlType t, int64_t T);
  // Whether it can take the rows kernel (the quantized types past one slice of rows, when
  // not the panel), which reads MatmulX::xi: x [T][n] interleaved by slices of slice_t rows,
  // slice i at xi + i · n · slice_t, [n][slice_t] (interleave_x below). It takes it where
  // rows_kernel_on(isa) too; matmul then sets xi, and the kernels take it where xi is set.
  bool (*uses_rows)(GgmlType t, int64_t T);
  int slice_t;
  // Lays x [T][n] out as MatmulX::xi (xi holds ceil(T / slice_t) · slice_t · n floats) and,
  // where sx is not null, writes the segment sums of x as segment_sums does, bit for bit.
  void (*interleave_x)(const float* x, int64_t T, int64_t n, float* xi, float* sx);
  // x [T][n] transposed per tile of tile_t tokens: tile i at xt + i · n · tile_t, [n][tile_t]
  // (the last tile's missing tokens are left unset); xt holds xt_floats(T, n) floats.
  int tile_t;
  void (*transpose_x)(const float* x, int64_t T, int64_t n, float* xt);
  int64_t xt_floats(int64_t T, int64_t n) const { return (T + tile_t - 1) / tile_t * tile_t * n; }
  // One attention chunk (attention_impl.h). Head sizes 64, 128, 256 on every path; any
  // other size on the scalar path only.
  void (*attn_chunk)(const AttnChunk& a);
  // out = Σ_c f_c·acc_c / Σ_c f_c·sum_c with f_c = exp(m_c − max m), chunks in order; the
  // attention row, if asked for, = e · f_c / Σ.
  void (*attn_combine)(const AttnCombine& a);
  // out[i] = silu(gate[i]) · up[i] for n values (act_impl.h); out may alias gate.
  void (*silu_glu)(const float* gate, const float* up, int64_t n, float* out);

  // Rows (rows_impl.h). n binary16 values at src as fp32 (exact), and back (round to
  // nearest even): the f16 KV cache rows. Bit for bit what fp16_to_fp32 / fp32_to_fp16 give.
  void (*f16_to_f32)(const uint8_t* src, float* dst, int64_t n);
  void (*f32_to_f16)(const float* src, uint8_t* dst, int64_t n);
  // dst[0..n) = the row's values: bit for bit what kvscope::dequantize_row gives.
  void (*dequantize_row)(GgmlType t, const void* src, float* dst, int64_t n);
  // Σ a[i]·b[i], and Σ row[i]·x[i] for a row of any supported type; each path sums in its
  // own order (agrees with kvscope::vec_dot to rounding).
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  float (*vec_dot)(GgmlType t, const void* row, const float* x, int64_t n);
};

// Whether the quantized products of more rows than one slice take the rows kernel where
// uses_rows allows it (each segment's weights decoded once into L1 for up to 64 rows) or
// the gemv slices (each slice of rows decodes the weights in registers again); each output
// has the same arithmetic, bit for bit, either way. The rows kernel by default, except with
// AVX-512 on Zen 5 (AMD family 0x1A), where the slices measured faster (the Q4_1 product
// of 16 to 512 rows 1.07-1.09x as fast, Q8_0's of 16 and 64 rows 1.07-1.11x, one thread;
// docs/performance.md has prefill and batched decode). Tests force either with set_rows_kernel;
// std::nullopt restores the default. Call it between products, like set_isa.
bool rows_kernel_on(Isa isa);
void set_rows_kernel(std::optional<bool> on);

const IsaKernels& kernels_avx512();
const IsaKernels& kernels_avx2();
const IsaKernels& kernels_scalar();

inline const IsaKernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return kernels_avx512();
    case Isa::Avx2:
      return kernels_avx2();
    default:
      return kernels_scalar();
  }
}

}  // namespace kvscope::cpu
