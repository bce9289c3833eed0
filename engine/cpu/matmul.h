// matmul.h — CPU matrix products on quantized weights.
//
// out[t][o] = sum_i W[o][i] * x[t][i] for x [T][n_in], W {n_in, n_out} packed for the
// CPU (packed_weight.h), out [T][n_out], with the kernels of the active instruction set
// (cpu_isa.h). Every output element is computed with the same arithmetic whatever T is,
// whatever the thread count and whichever instruction set (engine/cpu/kernels_impl.h):
// for the float types W[o][0]·x[0] + W[o][1]·x[1] + ... added in order with fused
// multiply-adds; for the quantized ones the same per segment of integers q, then scaled. A token's
// result therefore does not depend on how many tokens were batched with it — the KV CACHE and NO
// CACHE loops produce bit-identical logits.
#pragma once

#include <cstdint>

#include "engine/cpu/packed_weight.h"
#include "engine/cpu/thread_pool.h"

namespace kvscope::cpu {

void matmul(ThreadPool& pool, const PackedWeight& w, const float* x, int64_t T, float* out);

// Several products of the same x [T][n_in] in one parallel region: out_j = x · W_jᵀ.
struct MatmulJob {
  const PackedWeight* w;
  float* out;  // [T][w->n_out]
};
void matmul_many(ThreadPool& pool, const MatmulJob* jobs, int n_jobs, const float* x, int64_t T);

}  // namespace kvscope::cpu
