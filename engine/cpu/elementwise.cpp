// elementwise.cpp — see elementwise.h.
#include "engine/cpu/elementwise.h"

#include <cmath>
#include <vector>

namespace kvscope::cpu {

void rope_rows(float* x, int64_t T, int n_heads, int head_dim, RopeStyle style, int n_rot,
               float base, float freq_scale, int pos0) {
  const int half = n_rot / 2;
  std::vector<float> cs(static_cast<size_t>(n_rot));
  // Element offsets of pair i's two values inside a head.
  const int stride = style == RopeStyle::NeoX ? 1 : 2;
  const int second = style == RopeStyle::NeoX ? half : 1;
  for (int64_t t = 0; t < T; ++t) {
    const double pos = double(pos0 + t) * double(freq_scale);
    for (int i = 0; i < half; ++i) {
      const double theta = pos * std::pow(double(base), -2.0 * i / double(n_rot));
      cs[size_t(2 * i)] = float(std::cos(theta));
      cs[size_t(2 * i + 1)] = float(std::sin(theta));
    }
    float* row = x + t * int64_t(n_heads) * head_dim;
    for (int h = 0; h < n_heads; ++h) {
      float* v = row + int64_t(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float c = cs[size_t(2 * i)], s = cs[size_t(2 * i + 1)];
        float* a = v + i * stride;
        float* b = a + second;
        const float x0 = *a, x1 = *b;
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
      }
    }
  }
}

void glu(const float* gate, const float* up, int64_t n, FfnAct act, float* out) {
  if (act == FfnAct::Silu) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
    return;
  }
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
