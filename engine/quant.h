// quant.h — ggml block formats: sizes, dequantization and dot products; the plain scalar
// reference (engine/cpu/kernels.h has the CPU backend's per-instruction-set versions).
//
// Weights stay in their quantized form in memory; ops dequantize on the fly. A row of
// n values of a block type is n / block_size blocks back to back (n must be a multiple
// of block_size). Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/gguf.h"

namespace kvscope {

struct TypeTraits {
  const char* name;
  uint32_t block_size;  // values per block (1 for F32/F16/BF16)
  uint32_t type_size;   // bytes per block
  bool supported;       // dequantize_row / vec_dot implemented
};

// Traits for a type id; nullptr for ids ggml does not define (unknown types).
const TypeTraits* type_traits(uint32_t type_id);
inline const TypeTraits* type_traits(GgmlType t) { return type_traits(static_cast<uint32_t>(t)); }
bool type_supported(GgmlType t);
// Bytes of a row of n values; 0 if n is not a multiple of the block size or the type is unknown.
uint64_t row_bytes(GgmlType t, uint64_t n);

// IEEE binary16 / bfloat16 conversion (subnormals, inf and NaN handled; a binary16 NaN
// decodes quiet, payload kept, as the F16C instructions decode it).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
float bf16_to_fp32(uint16_t h);

// dst[0..n) = values of the row at src. n must be a multiple of the block size.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// sum_i row[i] * x[i] over n values of a quantized row and fp32 x: plain loops in index
// order (Q8_0, Q4_0, Q4_1 block by block); other types dequantize block by block.
float vec_dot(GgmlType t, const void* row, const float* x, int64_t n);

}  // namespace kvscope
