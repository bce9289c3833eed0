// kv_quant.h — quantizing KV cache rows to the GGUF block types q8_0 and q4_0 (their
// dequantization is dequantize_row in engine/quant.h).
//
// A cache row is one kv head's D values at one position, stored as blocks of 32 values
// along D in the GGUF layouts (docs/engine.md, "Quant blocks, bit by bit"):
//   q8_0 (34 B): fp16 d, 32 × int8 q;  d = max|x| / 127, q = round(x / d), x ≈ q·d.
//   q4_0 (18 B): fp16 d, 16 bytes of nibbles (byte j: value j low, value j+16 high);
//                d = m / −8 where m is the value of largest magnitude (sign kept),
//                q = min(15, trunc(x / d + 8.5)), x ≈ (q − 8)·d  (x·(1/d) + 8.5 as one fma).
// The scale is computed in fp32 and the quotient uses 1/d before d is rounded to fp16 (as
// ggml does), so a value is within half a step of its reconstruction plus |q| times the
// scale's fp16 rounding (≤ 2^-11 relative: q8_0 ≤ 0.562 steps in all, q4_0 ≤ 0.504) —
// and at q4_0's far end, where q = 16 clamps to 15, one step more. The CUDA kernels
// store rows the same way, bit for bit (kernels/kv_quant.cuh).
#pragma once

#include <cstdint>

namespace kvscope {

// n values (a multiple of 32) as n/32 blocks.
void quantize_row_q8_0(const float* x, uint8_t* blocks, int64_t n);
void quantize_row_q4_0(const float* x, uint8_t* blocks, int64_t n);

}  // namespace kvscope
