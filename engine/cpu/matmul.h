// matmul.h — CPU matrix products on quantized weights.
//
// out[t][o] = sum_i W[o][i] * x[t][i] for x [T][n_in], W {n_in, n_out} packed for the
// CPU (packed_weight.h), out [T][n_out], with the kernels of the active instruction set
// (cpu_isa.h). Every output element is computed with the same arithmetic whatever T is,
// whatever the thread count and whichever instruction set: W[o][0]·x[0] + W[o][1]·x[1]
// + ... added in order of the input index with fused multiply-adds
// (engine/cpu/kernels_impl.h). A token's result therefore does not depend on how many
// tokens were batched with it — the KV CACHE and NO CACHE loops produce bit-identical
// logits.
#pragma once

#include <cstdint>

#include "engine/cpu/packed_weight.h"
#include "engine/cpu/thread_pool.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvscope::cpu {

void matmul(ThreadPool& pool, const PackedWeight& w, const float* x, int64_t T, float* out);

// Several products of the same x [T][n_in] in one parallel region: out_j = x · W_jᵀ.
struct MatmulJob {
  const PackedWeight* w;
  float* out;  // [T][w->n_out]
};
void matmul_many(ThreadPool& pool, const MatmulJob* jobs, int n_jobs, const float* x, int64_t T);

// Dot product of two fp32 vectors (attention's q·k).
inline float dot_f32(const float* a, const float* b, int64_t n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += a[i + k] * b[i + k];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int k = 0; k < 8; ++k) s += lanes[k];
  return s;
}

// y[i] += a * x[i] for n values.
inline void axpy_f32(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 av = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace kvscope::cpu
