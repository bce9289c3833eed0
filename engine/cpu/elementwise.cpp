// elementwise.cpp — see elementwise.h.
#include "engine/cpu/elementwise.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvscope::cpu {

void rope_angles(int n_rot, float base, float freq_scale, int pos, float* cs) {
  const double p = double(pos) * double(freq_scale);
  for (int i = 0; i < n_rot / 2; ++i) {
    const double theta = p * std::pow(double(base), -2.0 * i / double(n_rot));
    cs[2 * i] = float(std::cos(theta));
    cs[2 * i + 1] = float(std::sin(theta));
  }
}

void rope_apply(float* x, int64_t T, int n_heads, int head_dim, RopeStyle style, int n_rot,
                const float* cs) {
  const int half = n_rot / 2;
  // Element offsets of pair i's two values inside a head.
  const int stride = style == RopeStyle::NeoX ? 1 : 2;
  const int second = style == RopeStyle::NeoX ? half : 1;
  for (int64_t t = 0; t < T; ++t) {
    const float* ct = cs + t * n_rot;
    float* row = x + t * int64_t(n_heads) * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + int64_t(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float c = ct[2 * i], s = ct[2 * i + 1];
        float* a = v + i * stride;
        float* b = a + second;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
      }
    }
  }
}

void rope_rows(float* x, int64_t T, int n_heads, int head_dim, RopeStyle style, int n_rot,
               float base, float freq_scale, int pos0) {
  std::vector<float> cs(static_cast<size_t>(n_rot));
  for (int64_t t = 0; t < T; ++t) {
    rope_angles(n_rot, base, freq_scale, int(pos0 + t), cs.data());
    rope_apply(x + t * int64_t(n_heads) * head_dim, 1, n_heads, head_dim, style, n_rot, cs.data());
  }
}

const float* RopeTable::angles(int n_rot, float base, float freq_scale, int pos0, int64_t T) {
  if (pos0 < 0 || T <= 0 || int64_t(pos0) + T > kMaxPositions) return nullptr;
  Entry* e = nullptr;
  for (Entry& x : entries_)
    if (x.n_rot == n_rot && x.base == base && x.freq_scale == freq_scale) e = &x;
  if (!e) {
    entries_.push_back({n_rot, base, freq_scale, 0, {}});
    e = &entries_.back();
  }
  const int64_t need = int64_t(pos0) + T;
  if (e->n_pos < need) {
    // By half again, in whole steps of kGrowth positions: a decode step that grows the
    // table is one of every kGrowth at least.
    const int64_t grown = std::max(need, e->n_pos + e->n_pos / 2);
    const int64_t n = std::min<int64_t>(kMaxPositions, (grown + kGrowth - 1) / kGrowth * kGrowth);
    e->cs.resize(size_t(n * n_rot));
    for (int64_t p = e->n_pos; p < n; ++p)
      rope_angles(n_rot, base, freq_scale, int(p), e->cs.data() + p * n_rot);
    e->n_pos = n;
  }
  return e->cs.data() + int64_t(pos0) * n_rot;
}

void gelu_glu(const float* gate, const float* up, int64_t n, float* out) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void add_bias(float* x, int64_t T, int64_t n, const float* b) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) x[t * n + i] += b[i];
}

}  // namespace kvscope::cpu
