// elementwise.h — the CPU backend's element-wise ops on fp32 rows: RoPE (adjacent or
// NeoX pairs), gated activations (SiLU, tanh-GELU) and bias adds. Each output element
// is computed by the same arithmetic whatever the batch, so a token's result does not
// depend on how many tokens went through with it (CACHE and NO CACHE stay bit-identical).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model.h"

namespace kvscope::cpu {

// In place on rows x[t] of n_heads*head_dim values, row t at position pos0 + t: each
// head's pairs among its first n_rot dims — (2i, 2i+1) for Adjacent, (i, i + n_rot/2)
// for NeoX — rotated by theta_i = pos * freq_scale * base^(-2i/n_rot) (angle in double,
// cos/sin rounded to float).
void rope_rows(float* x, int64_t T, int n_heads, int head_dim, RopeStyle style, int n_rot,
               float base, float freq_scale, int pos0);

// rope_rows in two halves. rope_angles: position pos's cos θ_i, sin θ_i into cs[2i],
// cs[2i + 1] (n_rot values). rope_apply: rows x[t] rotated by cs + t·n_rot.
void rope_angles(int n_rot, float base, float freq_scale, int pos, float* cs);
void rope_apply(float* x, int64_t T, int n_heads, int head_dim, RopeStyle style, int n_rot,
                const float* cs);

// The angles of rope_angles kept per (n_rot, base, freq_scale) for positions 0 .. n, so
// that each is worked out once per run rather than twice per layer and step (the double
// pow, cos and sin cost more than the rotation). The same numbers as rope_rows.
class RopeTable {
 public:
  static constexpr int64_t kMaxPositions = int64_t(1) << 17;  // 32 MiB at n_rot 64; past it, no table
  static constexpr int64_t kGrowth = 256;  // the table grows in whole steps of this many positions
  // cs for positions pos0 .. pos0 + T − 1, [T][n_rot]; null outside [0, kMaxPositions).
  // Valid until the next call.
  const float* angles(int n_rot, float base, float freq_scale, int pos0, int64_t T);

 private:
  struct Entry {
    int n_rot;
    float base, freq_scale;
    int64_t n_pos;
    std::vector<float> cs;  // [n_pos][n_rot]
  };
  std::vector<Entry> entries_;
};

// out[i] = gelu_tanh(gate[i]) * up[i] for n values; out may alias gate. (The gated SiLU
// is per instruction set: IsaKernels::silu_glu.)
void gelu_glu(const float* gate, const float* up, int64_t n, float* out);

// x[t][i] += b[i] for T rows of n values.
void add_bias(float* x, int64_t T, int64_t n, const float* b);

}  // namespace kvscope::cpu
