// matmul_batched.cu — quantized matrix times a batch of activation rows (a batched decode
// step of 9..64 sequences, or a short prefill): a small GEMM out = x · Wᵀ that reads W in
// its stored (quantized) form, so no fp32 copy of the weight is needed.
//
// Thread mapping: a block of 256 threads (16 x 16) computes a tile of 64 output rows o by
// 64 activation rows t; each thread a 4 x 4 micro-tile (o = o0 + tx + 16 i, t = t0 + ty +
// 16 j). The input dimension goes in chunks of 32 values: the block decodes the W tile's
// 64 x 32 values once into shared memory (8 per thread) and loads the matching 64 x 32
// activations, then every thread accumulates its micro-tile from shared memory. One W
// tile serves all 64 activation rows: per step the weight bytes read are the quantized
// bytes (once per 64 rows), where the cuBLAS path read a 4-8x larger fp32 copy.
//
// Numbers: weights decode exactly (dequant_value, the same as dequantize_f32), activations
// and accumulation are fp32; each output sums its n_in products in input order, one
// chunk after another, so a row's result does not depend on T or on the other rows.
// Shapes: w {n_in, n_out} (n_out rows), x [T][n_in] fp32, out [T][n_out] fp32.
#include "kernels/launch.cuh"
#include "kernels/quant.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kTileO = 64;  // output rows per block
constexpr int kTileT = 64;  // activation rows per block
constexpr int kChunk = 32;  // input values per shared-memory step
constexpr int kSide = 16;   // threads per block side
constexpr int kThreads = kSide * kSide;
constexpr int kMicro = kTileO / kSide;  // 4 x 4 outputs per thread
static_assert(kTileO == kTileT, "the micro-tile is square");
static_assert(kTileO * kChunk % kThreads == 0, "whole decode work per thread");

// dequant_value with the type fixed at compile time (the switch folds away).
template <QType kType>
__device__ __forceinline__ float decode_at(const uint8_t* row, int64_t i) {
  return dequant_value(kType, row, i);
}

template <QType kType>
__global__ void __launch_bounds__(kThreads)
    matmul_batched_kernel(const uint8_t* w, int64_t row_bytes, int64_t n_in, int64_t n_out,
                          const float* x, int T, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float ws[kTileO][kChunk + 1];  // +1: the micro-tile's column reads hit distinct banks
  __shared__ float xs[kTileT][kChunk + 1];
  const int tx = threadIdx.x % kSide, ty = threadIdx.x / kSide;
  const int64_t o0 = int64_t(blockIdx.x) * kTileO;
  const int t0 = int(blockIdx.y) * kTileT;
  // This thread's decode share: 8 consecutive values of one W row of the tile.
  constexpr int kPer = kTileO * kChunk / kThreads;
  const int dr = threadIdx.x / (kChunk / kPer), dc = (threadIdx.x % (kChunk / kPer)) * kPer;
  const bool d_row_ok = o0 + dr < n_out;
  const uint8_t* d_row = w + (d_row_ok ? o0 + dr : 0) * row_bytes;
  float acc[kMicro][kMicro];
#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < n_in; k0 += kChunk) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = k0 + dc + e;
      ws[dr][dc + e] = d_row_ok && i < n_in ? decode_at<kType>(d_row, i) : 0.0f;
    }
    // Activations: consecutive threads read consecutive values of a row (coalesced).
    for (int idx = threadIdx.x; idx < kTileT * kChunk; idx += kThreads) {
      const int r = idx / kChunk, c = idx % kChunk;
      const int64_t i = k0 + c;
      xs[r][c] = t0 + r < T && i < n_in ? x[int64_t(t0 + r) * n_in + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < kChunk; ++c) {
      float wv[kMicro], xv[kMicro];
#pragma unroll
      for (int i = 0; i < kMicro; ++i) wv[i] = ws[tx + kSide * i][c];
#pragma unroll
      for (int j = 0; j < kMicro; ++j) xv[j] = xs[ty + kSide * j][c];
#pragma unroll
      for (int i = 0; i < kMicro; ++i)
#pragma unroll
        for (int j = 0; j < kMicro; ++j) acc[i][j] += wv[i] * xv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kMicro; ++j) {
    const int t = t0 + ty + kSide * j;
    if (t >= T) continue;
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
      const int64_t o = o0 + tx + kSide * i;
      if (o < n_out) out[int64_t(t) * n_out + o] = acc[i][j];
    }
  }
}

template <QType kType>
cudaError_t launch_batched(QMatrix w, const float* x, int T, float* out, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((w.n_out + kTileO - 1) / kTileO),
                  static_cast<unsigned>((T + kTileT - 1) / kTileT));
  return launch(matmul_batched_kernel<kType>, grid, dim3(kThreads), 0, s,
                static_cast<const uint8_t*>(w.data), w.row_bytes, w.n_in, w.n_out, x, T, out);
}

}  // namespace

bool matmul_batched_supported(QType t) {
  return qtype_supported(int(t));
}

cudaError_t matmul_batched(QMatrix w, const float* x, int T, float* out, cudaStream_t s) {
  if (T <= 0 || w.n_out == 0) return cudaSuccess;
  const int block = qtype_block_size(int(w.type));
  if (block <= 0 || w.n_in <= 0 || w.n_in % block != 0 || w.data == nullptr)
    return cudaErrorInvalidValue;
  switch (w.type) {
    case QType::F32:
      return launch_batched<QType::F32>(w, x, T, out, s);
    case QType::F16:
      return launch_batched<QType::F16>(w, x, T, out, s);
    case QType::BF16:
      return launch_batched<QType::BF16>(w, x, T, out, s);
    case QType::Q4_0:
      return launch_batched<QType::Q4_0>(w, x, T, out, s);
    case QType::Q4_1:
      return launch_batched<QType::Q4_1>(w, x, T, out, s);
    case QType::Q5_0:
      return launch_batched<QType::Q5_0>(w, x, T, out, s);
    case QType::Q5_1:
      return launch_batched<QType::Q5_1>(w, x, T, out, s);
    case QType::Q8_0:
      return launch_batched<QType::Q8_0>(w, x, T, out, s);
    case QType::Q4_K:
      return launch_batched<QType::Q4_K>(w, x, T, out, s);
    case QType::Q5_K:
      return launch_batched<QType::Q5_K>(w, x, T, out, s);
    case QType::Q6_K:
      return launch_batched<QType::Q6_K>(w, x, T, out, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvscope::cuda
