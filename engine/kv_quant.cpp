// kv_quant.cpp — q8_0 / q4_0 quantization of KV cache rows (see kv_quant.h).
#include "engine/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/quant.h"

namespace kvscope {

void quantize_row_q8_0(const float* x, uint8_t* blocks, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    uint8_t* out = blocks + 34 * b;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    for (int i = 0; i < 32; ++i) out[2 + i] = uint8_t(int8_t(std::round(v[i] * id)));
  }
}

void quantize_row_q4_0(const float* x, uint8_t* blocks, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* v = x + 32 * b;
    uint8_t* out = blocks + 18 * b;
    float amax = 0.0f, m = 0.0f;  // the value of largest magnitude, sign kept (first wins)
    for (int i = 0; i < 32; ++i)
      if (std::fabs(v[i]) > amax) {
        amax = std::fabs(v[i]);
        m = v[i];
      }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 16; ++j) {
      // One rounding for x·id + 8.5 (an explicit fma), as the CUDA store does.
      const int lo = std::min(15, int(std::fma(v[j], id, 8.5f)));
      const int hi = std::min(15, int(std::fma(v[j + 16], id, 8.5f)));
      out[2 + j] = uint8_t(lo | (hi << 4));
    }
  }
}

}  // namespace kvscope
