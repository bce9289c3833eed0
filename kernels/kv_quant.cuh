// kv_quant.cuh — the KV cache's element types on the device (f32, f16, q8_0, q4_0), as
// traits the cache kernels are templated on: a row's size, reading value d of a cached
// row, and storing 32 consecutive values of a row with one warp (a q8_0 / q4_0 block
// needs the largest magnitude of its 32 values, a warp reduction).
//
// Row layouts (D values of one kv head at one slot): f32 D floats; f16 D halves; q8_0
// D/32 blocks of 34 B (fp16 d, int8 q[32]); q4_0 D/32 blocks of 18 B (fp16 d, byte j =
// value j | value j+16 << 4) — the GGUF blocks (docs/engine.md, "Quant blocks, bit by bit").
//
// The stores round exactly as the CPU does (engine/kv_quant.cpp): the fp32 scale (amax /
// 127, or the signed largest value / -8), its reciprocal 1/d taken before d is rounded to
// fp16 (round to nearest even), then q8_0 q = round-half-away(x * id) and q4_0
// q = min(15, trunc(fma(x, id, 8.5))). IEEE division and one fma on both sides, so the
// cache bytes are the CPU's bit for bit. Dequantized values d·q are exact in fp32 (an
// 11-bit scale times an 8-bit integer), equal to the CPU's load_row.
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"
#include "kernels/quant.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {

// A block's fp16 scale, as one 16-bit store: blocks are 34 or 18 bytes and rows start at
// even offsets of a cudaMalloc'd cache, so the address is always 2-byte aligned. (Splitting
// the half's bits into two byte stores lost the low byte on an H100 with nvcc 13.0, sm_90:
// every scale came out as its high byte only; the emulator, compiled by g++, did not show
// it. test_kernel_kv_quant_gpu checks the stored bytes on a real GPU.)
__device__ __forceinline__ void st_f16(uint8_t* p, float f) {
  *reinterpret_cast<__half*>(p) = __float2half_rn(f);
}
// The same scale read back as one 16-bit load (the same alignment).
__device__ __forceinline__ float ld_scale(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// store32(row, d0, x, valid): called by all 32 lanes of a (full) warp together; lane l
// holds value d0 + l of the row in x, stored when `valid` (d0 + l < D; always true for
// the block types, whose D is a multiple of 32).
struct KvF32 {
  static constexpr bool kBlock = false;
  __host__ __device__ static int64_t row_bytes(int D) { return int64_t(D) * 4; }
  __device__ static float load(const uint8_t* row, int d) {
    return reinterpret_cast<const float*>(row)[d];
  }
  __device__ static void store32(uint8_t* row, int d0, float x, bool valid) {
    if (valid) reinterpret_cast<float*>(row)[d0 + static_cast<int>(threadIdx.x % 32)] = x;
  }
};

struct KvF16 {
  static constexpr bool kBlock = false;
  __host__ __device__ static int64_t row_bytes(int D) { return int64_t(D) * 2; }
  __device__ static float load(const uint8_t* row, int d) {
    return __half2float(reinterpret_cast<const __half*>(row)[d]);
  }
  __device__ static void store32(uint8_t* row, int d0, float x, bool valid) {
    if (valid)
      reinterpret_cast<__half*>(row)[d0 + static_cast<int>(threadIdx.x % 32)] = __float2half_rn(x);
  }
};

struct KvQ8_0 {
  static constexpr bool kBlock = true;
  __host__ __device__ static int64_t row_bytes(int D) { return int64_t(D / 32) * 34; }
  __device__ static float load(const uint8_t* row, int d) {
    const uint8_t* b = row + (d / 32) * 34;
    return ld_scale(b) * static_cast<float>(static_cast<int8_t>(b[2 + d % 32]));
  }
  __device__ static void store32(uint8_t* row, int d0, float x, bool /*valid*/) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const float amax = warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* b = row + (d0 / 32) * 34;
    if (lane == 0) st_f16(b, d);
    b[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(x * id)));
  }
};

struct KvQ4_0 {
  static constexpr bool kBlock = true;
  __host__ __device__ static int64_t row_bytes(int D) { return int64_t(D / 32) * 18; }
  __device__ static float load(const uint8_t* row, int d) {
    const uint8_t* b = row + (d / 32) * 18;
    const int j = d % 32;
    const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
    return ld_scale(b) * static_cast<float>(q - 8);
  }
  __device__ static void store32(uint8_t* row, int d0, float x, bool /*valid*/) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    // The value of largest magnitude, sign kept; the lowest lane wins a tie (the CPU's
    // scan keeps the first).
    float ax = fabsf(x);
    int at = lane;
    for (int o = 16; o > 0; o >>= 1) {
      const float oa = __shfl_xor_sync(kFullMask, ax, o);
      const int oi = __shfl_xor_sync(kFullMask, at, o);
      if (oa > ax || (oa == ax && oi < at)) {
        ax = oa;
        at = oi;
      }
    }
    const float mx = __shfl_sync(kFullMask, x, at);
    const float m = ax > 0.0f ? mx : 0.0f;  // an all-zero block: +0, as on the CPU
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int qi = static_cast<int>(fmaf(x, id, 8.5f));
    const int q = qi < 15 ? qi : 15;
    const int hi = __shfl_down_sync(kFullMask, q, 16);
    uint8_t* b = row + (d0 / 32) * 18;
    if (lane == 0) st_f16(b, d);
    if (lane < 16) b[2 + lane] = static_cast<uint8_t>(q | (hi << 4));
  }
};

}  // namespace kvscope::cuda
