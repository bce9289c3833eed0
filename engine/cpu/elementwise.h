// elementwise.h — the CPU backend's element-wise ops on fp32 rows: RoPE (adjacent or
// NeoX pairs), gated activations (SiLU, tanh-GELU) and bias adds. Each output element
// is computed by the same arithmetic whatever the batch, so a token's result does not
// depend on how many tokens went through with it (CACHE and NO CACHE stay bit-identical).
#pragma once

#include <cstdint>

#include "engine/model.h"

namespace kvscope::cpu {

// In place on rows x[t] of n_heads*head_dim values, row t at position pos0 + t: each
// head's pairs among its first n_rot dims — (2i, 2i+1) for Adjacent, (i, i + n_rot/2)
// for NeoX — rotated by theta_i = pos * freq_scale * base^(-2i/n_rot) (angle in double,
// cos/sin rounded to float).
void rope_rows(float* x, int64_t T, int n_heads, int head_dim, RopeStyle style, int n_rot,
               float base, float freq_scale, int pos0);

// out[i] = act(gate[i]) * up[i] for n values; out may alias gate.
void glu(const float* gate, const float* up, int64_t n, FfnAct act, float* out);

// x[t][i] += b[i] for T rows of n values.
void add_bias(float* x, int64_t T, int64_t n, const float* b);

}  // namespace kvscope::cpu
