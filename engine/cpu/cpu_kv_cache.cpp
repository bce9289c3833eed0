// cpu_kv_cache.cpp — cached K/V rows to and from fp32 (see cpu_kv_cache.h).
#include "engine/cpu/cpu_kv_cache.h"

#include "engine/kv_quant.h"
#include "engine/quant.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvscope::cpu {

// Loads D values of a cache row as fp32.
void load_row(KvDtype dtype, const uint8_t* src, float* dst, int D) {
  if (dtype == KvDtype::F32) {
    std::memcpy(dst, src, size_t(D) * 4);
  } else if (dtype == KvDtype::Q8_0 || dtype == KvDtype::Q4_0) {
    dequantize_row(GgmlType(int(dtype)), src, dst, D);
  } else {
#if defined(__AVX512F__)
    int i = 0;
    for (; i + 16 <= D; i += 16)
      _mm512_storeu_ps(
          dst + i,
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i))));
    for (; i < D; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = _cvtsh_ss(h);
    }
    return;
#endif
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
    for (int i = 0; i < D; ++i) dst[i] = fp16_to_fp32(h[i]);
  }
}

void store_row(KvDtype dtype, const float* src, uint8_t* dst, int D) {
  if (dtype == KvDtype::F32) {
    std::memcpy(dst, src, size_t(D) * 4);
  } else if (dtype == KvDtype::Q8_0) {
    quantize_row_q8_0(src, dst, D);
  } else if (dtype == KvDtype::Q4_0) {
    quantize_row_q4_0(src, dst, D);
  } else {
#if defined(__AVX512F__)
    int i = 0;
    for (; i + 16 <= D; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < D; ++i) {
      const uint16_t h = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
      std::memcpy(dst + 2 * i, &h, 2);
    }
    return;
#endif
    uint16_t* h = reinterpret_cast<uint16_t*>(dst);
    for (int i = 0; i < D; ++i) h[i] = fp32_to_fp16(src[i]);
  }
}

}  // namespace kvscope::cpu
