// matmul.h — CPU matrix products on quantized weights.
//
// out[t][o] = sum_i W[o][i] * x[t][i] for x [T][n_in], W {n_in, n_out} in its stored
// type, out [T][n_out]. The value of every output element is computed with the same
// arithmetic whatever T is (same dequantized values, same chunk order, same reduction),
// so a token's result does not depend on how many tokens were batched with it — the
// KV CACHE and NO CACHE loops therefore produce bit-identical logits.
#pragma once

#include <cstdint>

#include "engine/cpu/thread_pool.h"
#include "engine/model.h"

namespace kvscope::cpu {

void matmul(ThreadPool& pool, const Weight& w, const float* x, int64_t T, float* out);

// Dot product of two fp32 vectors with the same chunk order and reduction as matmul.
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace kvscope::cpu
