// cpu_kv_cache.cpp — cached K/V rows to and from fp32 (see cpu_kv_cache.h), with the
// kernels of the active instruction set (cpu_isa.h) for the f16 and block rows.
#include "engine/cpu/cpu_kv_cache.h"

#include "engine/cpu/kernels.h"
#include "engine/kv_quant.h"
#include "engine/quant.h"

namespace kvscope::cpu {

// Loads D values of a cache row as fp32.
void load_row(KvDtype dtype, const uint8_t* src, float* dst, int D) {
  if (dtype == KvDtype::F32) {
    std::memcpy(dst, src, size_t(D) * 4);
  } else if (dtype == KvDtype::Q8_0 || dtype == KvDtype::Q4_0) {
    kernels(isa_active()).dequantize_row(GgmlType(int(dtype)), src, dst, D);
  } else {
    kernels(isa_active()).f16_to_f32(src, dst, D);
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
    kernels(isa_active()).f32_to_f16(src, dst, D);
  }
}

}  // namespace kvscope::cpu
