// matmul.cpp — CPU matrix products on quantized weights (see matmul.h).
//
// Work split: output rows are divided among the pool's threads. Each thread takes its
// rows four at a time, dequantizes those four rows into a small fp32 buffer (it stays in
// L1), and multiplies them with the tokens four at a time (a 4x4 register tile of
// 16-lane accumulators). Tokens are visited in tiles of 64 so the activations in use
// stay in L2. Each (row, token) result is one accumulator over 16-value chunks in order,
// reduced the same way, independent of T.
#include "engine/cpu/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/quant.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvscope::cpu {
namespace {

#if defined(__AVX512F__)
// binary16 -> fp32 with the F16C instruction (exact, like fp16_to_fp32).
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// The two binary16 values at p (a Q4_1 block's d and m) as fp32 lanes 0 and 1.
inline __m128 scales_at(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

// Block decoders: the 32 values of one block as two 16-lane registers. Both the batched
// path (dequant_rows) and the single-token path (gemv) decode through these, so the two
// see bit-identical weights.
struct Q4_1Block {
  static constexpr int kBytes = 20;
  static void decode(const uint8_t* blk, __m512* v0, __m512* v1) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128 dm = scales_at(blk);
    const __m512 d = _mm512_broadcastss_ps(dm);
    const __m512 m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 4));
    *v0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, low))), d, m);
    *v1 = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low))), d, m);
  }
};

struct Q8_0Block {
  static constexpr int kBytes = 34;
  static void decode(const uint8_t* blk, __m512* v0, __m512* v1) {
    const __m512 d = _mm512_set1_ps(half_at(blk));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    *v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    *v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
  }
};

// Single-token products of NR rows: the same dequantized values and the same chunk order
// as dequant_rows + tile<NR, 1>, without the round trip through memory.
template <class Block, int NR>
void gemv(const Weight& w, int64_t r0, const float* x, float* out) {
  const int64_t nb = w.n_in / 32;
  __m512 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* rows = w.data + uint64_t(r0) * w.row_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    for (int r = 0; r < NR; ++r) {
      __m512 v0, v1;
      Block::decode(rows + r * w.row_bytes + b * Block::kBytes, &v0, &v1);
      acc[r] = _mm512_fmadd_ps(v0, x0, acc[r]);
      acc[r] = _mm512_fmadd_ps(v1, x1, acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}

template <class Block>
void gemv_rows_of(const Weight& w, int64_t r_begin, int64_t r_end, const float* x, float* out) {
  int64_t r = r_begin;
  for (; r + 4 <= r_end; r += 4) gemv<Block, 4>(w, r, x, out + r);
  for (; r < r_end; ++r) gemv<Block, 1>(w, r, x, out + r);
}

// Rows of one block type into buf (n values per row).
template <class Block>
void decode_row(const uint8_t* row, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / 32; ++b) {
    __m512 v0, v1;
    Block::decode(row + b * Block::kBytes, &v0, &v1);
    _mm512_storeu_ps(dst + b * 32, v0);
    _mm512_storeu_ps(dst + b * 32 + 16, v1);
  }
}

// T == 1 for Q4_1 / Q8_0 rows [r_begin, r_end); false if the type has no fused path.
bool gemv_rows(const Weight& w, int64_t r_begin, int64_t r_end, const float* x, float* out) {
  switch (w.type) {
    case GgmlType::Q4_1: gemv_rows_of<Q4_1Block>(w, r_begin, r_end, x, out); return true;
    case GgmlType::Q8_0: gemv_rows_of<Q8_0Block>(w, r_begin, r_end, x, out); return true;
    default: return false;
  }
}
#endif

constexpr int kRowBlock = 4;
constexpr int64_t kTokenTile = 64;

#if defined(__AVX512F__)

// Dequantizes rows [r0, r0+nr) of w into buf (nr x n_in floats). Fast paths for the
// common types; the rest through dequantize_row.
void dequant_rows(const Weight& w, int64_t r0, int nr, float* buf) {
  const int64_t n = w.n_in;
  for (int r = 0; r < nr; ++r) {
    const uint8_t* row = w.data + uint64_t(r0 + r) * w.row_bytes;
    float* dst = buf + r * n;
    switch (w.type) {
      case GgmlType::Q4_1:
        decode_row<Q4_1Block>(row, n, dst);
        break;
      case GgmlType::Q8_0:
        decode_row<Q8_0Block>(row, n, dst);
        break;
      case GgmlType::F32:
        std::memcpy(dst, row, size_t(n) * 4);
        break;
      default:
        dequantize_row(w.type, row, dst, n);
        break;
    }
  }
}

// out[t * ldo + r] = dot(w_rows[r], x[t]) for NR rows and NT tokens.
template <int NR, int NT>
void tile(const float* w_rows, int64_t n, const float* x, int64_t ldx, float* out, int64_t ldo) {
  __m512 acc[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __m512 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm512_loadu_ps(x + t * ldx + i);
    for (int r = 0; r < NR; ++r) {
      const __m512 wv = _mm512_loadu_ps(w_rows + r * n + i);
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int NR>
void tile_tokens(const float* w_rows, int64_t n, const float* x, int64_t nt, float* out,
                 int64_t ldo) {
  int64_t t = 0;
  for (; t + 4 <= nt; t += 4) tile<NR, 4>(w_rows, n, x + t * n, n, out + t * ldo, ldo);
  switch (nt - t) {
    case 3: tile<NR, 3>(w_rows, n, x + t * n, n, out + t * ldo, ldo); break;
    case 2: tile<NR, 2>(w_rows, n, x + t * n, n, out + t * ldo, ldo); break;
    case 1: tile<NR, 1>(w_rows, n, x + t * n, n, out + t * ldo, ldo); break;
    default: break;
  }
}

void rows_kernel(const Weight& w, int64_t r_begin, int64_t r_end, const float* x, int64_t T,
                 float* out) {
  if (T == 1 && gemv_rows(w, r_begin, r_end, x, out)) return;
  const int64_t n = w.n_in, ldo = w.n_out;
  thread_local std::vector<float> buf;
  buf.resize(size_t(kRowBlock * n));
  for (int64_t t0 = 0; t0 < T; t0 += kTokenTile) {
    const int64_t nt = std::min(kTokenTile, T - t0);
    for (int64_t r = r_begin; r < r_end; r += kRowBlock) {
      const int nr = int(std::min<int64_t>(kRowBlock, r_end - r));
      dequant_rows(w, r, nr, buf.data());
      const float* xt = x + t0 * n;
      float* o = out + t0 * ldo + r;
      switch (nr) {
        case 4: tile_tokens<4>(buf.data(), n, xt, nt, o, ldo); break;
        case 3: tile_tokens<3>(buf.data(), n, xt, nt, o, ldo); break;
        case 2: tile_tokens<2>(buf.data(), n, xt, nt, o, ldo); break;
        default: tile_tokens<1>(buf.data(), n, xt, nt, o, ldo); break;
      }
    }
  }
}

#endif  // __AVX512F__

// Portable path (and rows whose length is not a multiple of 16): one row at a time,
// dequantized, then a plain dot per token with the chunked order of dot_f32.
void rows_kernel_generic(const Weight& w, int64_t r_begin, int64_t r_end, const float* x,
                         int64_t T, float* out) {
  const int64_t n = w.n_in;
  thread_local std::vector<float> buf;
  buf.resize(size_t(n));
  for (int64_t r = r_begin; r < r_end; ++r) {
    dequantize_row(w.type, w.data + uint64_t(r) * w.row_bytes, buf.data(), n);
    for (int64_t t = 0; t < T; ++t) out[t * w.n_out + r] = dot_f32(buf.data(), x + t * n, n);
  }
}

}  // namespace

namespace {

// Rows [b, e) of one weight's product.
void run_rows(const Weight& w, int64_t b, int64_t e, const float* x, int64_t T, float* out) {
#if defined(__AVX512F__)
  if (w.n_in % 16 == 0) {
    rows_kernel(w, b, e, x, T, out);
    return;
  }
#endif
  rows_kernel_generic(w, b, e, x, T, out);
}

}  // namespace

void matmul_many(ThreadPool& pool, const MatmulJob* jobs, int n_jobs, const float* x, int64_t T) {
  // The jobs' rows, concatenated, are split among the threads in one parallel region
  // (a decode step issues fewer hand-offs). Row blocks never straddle two jobs' results
  // in a way that changes arithmetic: every row is computed by run_rows alone.
  int64_t total = 0, work = 0;
  for (int j = 0; j < n_jobs; ++j) {
    total += jobs[j].w->n_out;
    work += jobs[j].w->n_in * jobs[j].w->n_out * T;
  }
  auto run = [&](int64_t b, int64_t e) {
    int64_t base = 0;
    for (int j = 0; j < n_jobs && b < e; ++j) {
      const int64_t n = jobs[j].w->n_out;
      const int64_t lo = std::max(b, base), hi = std::min(e, base + n);
      if (lo < hi) run_rows(*jobs[j].w, lo - base, hi - base, x, T, jobs[j].out);
      base += n;
    }
  };
  if (work < 32768) {  // small products are not worth waking the pool for
    run(0, total);
    return;
  }
  pool.parallel_for(total, run, kRowBlock);
}

void matmul(ThreadPool& pool, const Weight& w, const float* x, int64_t T, float* out) {
  const MatmulJob job{&w, out};
  matmul_many(pool, &job, 1, x, T);
}

}  // namespace kvscope::cpu
