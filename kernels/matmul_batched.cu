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
// Split input: a block's chain of chunks is the kernel's latency, and a matrix of few
// tiles (576 rows: 9 tiles) would leave most of the GPU idle while 9 blocks walk every
// chunk. So such a matrix splits its chunks over grid.z = S blocks per tile
// (matmul_batched_splits: about target_blocks blocks, from the shape alone); each writes
// its partial tile to work [S][T][n_out], and the last block of the tile to finish
// (last_block.cuh) adds the S partials in split order and writes out.
//
// Numbers: weights decode exactly (dequant_value, the same as dequantize_f32), activations
// and accumulation are fp32; each split sums its products in input order, one chunk after
// another, and the splits add in order: the order depends only on the matrix's shape, so
// a row's result does not depend on T or on the other rows.
// Shapes: w {n_in, n_out} (n_out rows), x [T][n_in] fp32, out [T][n_out] fp32.
#include "kernels/last_block.cuh"
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
static_assert(kTileT * kChunk % kThreads == 0, "whole activation loads per thread");

// dequant_value with the type fixed at compile time (the switch folds away).
template <QType kType>
__device__ __forceinline__ float decode_at(const uint8_t* row, int64_t i) {
  return dequant_value(kType, row, i);
}

// f(i, j, t, o) for each output of the thread's micro-tile (o = o0 + tx + 16 i, t = t0 +
// ty + 16 j) that lies inside out [T][n_out].
template <class F>
__device__ __forceinline__ void micro_tile_outputs(int t0, int64_t o0, int tx, int ty, int T,
                                                   int64_t n_out, F f) {
#pragma unroll
  for (int j = 0; j < kMicro; ++j) {
    const int t = t0 + ty + kSide * j;
    if (t >= T) continue;
#pragma unroll
    for (int i = 0; i < kMicro; ++i) {
      const int64_t o = o0 + tx + kSide * i;
      if (o < n_out) f(i, j, t, o);
    }
  }
}

template <QType kType>
__global__ void __launch_bounds__(kThreads)
    matmul_batched_kernel(const uint8_t* w, int64_t row_bytes, int64_t n_in, int64_t n_out,
                          const float* x, int T, float* out, int chunks_per_split, float* work,
                          unsigned* counters) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float ws[kTileO][kChunk + 1];  // +1: the micro-tile's column reads hit distinct banks
  __shared__ float xs[kTileT][kChunk + 1];
  __shared__ int last;  // last_block_to_arrive's flag (split input only)
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
  const int64_t k_begin = int64_t(blockIdx.z) * chunks_per_split * kChunk;
  const int64_t k_end = k_begin + int64_t(chunks_per_split) * kChunk < n_in
                            ? k_begin + int64_t(chunks_per_split) * kChunk
                            : n_in;
  // Software pipelined: the next chunk's weights (decoded) and activations are loaded into
  // registers before this chunk's products, so their memory latency overlaps the
  // arithmetic instead of preceding it; they go to shared memory after the barrier.
  // Activations: consecutive threads read consecutive values of a row (coalesced).
  constexpr int kXPer = kTileT * kChunk / kThreads;
  float wn[kPer], xn[kXPer];
  const auto load_chunk = [&](int64_t k0) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int64_t i = k0 + dc + e;
      wn[e] = d_row_ok && i < n_in ? decode_at<kType>(d_row, i) : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kXPer; ++e) {
      const int idx = static_cast<int>(threadIdx.x) + e * kThreads;
      const int r = idx / kChunk, c = idx % kChunk;
      const int64_t i = k0 + c;
      xn[e] = t0 + r < T && i < n_in ? x[int64_t(t0 + r) * n_in + i] : 0.0f;
    }
  };
  if (k_begin < k_end) load_chunk(k_begin);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kChunk) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) ws[dr][dc + e] = wn[e];
#pragma unroll
    for (int e = 0; e < kXPer; ++e) {
      const int idx = static_cast<int>(threadIdx.x) + e * kThreads;
      xs[idx / kChunk][idx % kChunk] = xn[e];
    }
    __syncthreads();
    if (k0 + kChunk < k_end) load_chunk(k0 + kChunk);
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
  const int splits = static_cast<int>(gridDim.z);
  float* dst = splits == 1 ? out : work + int64_t(blockIdx.z) * T * n_out;
  micro_tile_outputs(t0, o0, tx, ty, T, n_out, [&](int i, int j, int t, int64_t o) {
    dst[int64_t(t) * n_out + o] = acc[i][j];
  });
  if (splits == 1) return;
  const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (!last_block_to_arrive(counters + tile, static_cast<unsigned>(splits), &last)) return;
  // The tile's outputs: the splits' partials added in split order (this block's own
  // included, read back like the others'). Each output's sum is ((0 + p0) + p1) + ...;
  // the loads of kZGroup splits are all issued before their adds, so a thread has 16 x
  // kZGroup loads in flight rather than one: this epilogue is one block reading every
  // partial of its tile, and one load at a time it cost more than the products.
  constexpr int kZGroup = 4;
  float sum[kMicro][kMicro];
#pragma unroll
  for (int i = 0; i < kMicro; ++i)
#pragma unroll
    for (int j = 0; j < kMicro; ++j) sum[i][j] = 0.0f;
  for (int z0 = 0; z0 < splits; z0 += kZGroup) {
    float p[kZGroup][kMicro][kMicro];
#pragma unroll
    for (int g = 0; g < kZGroup; ++g)
      micro_tile_outputs(t0, o0, tx, ty, T, n_out, [&](int i, int j, int t, int64_t o) {
        p[g][i][j] = z0 + g < splits ? work[(int64_t(z0 + g) * T + t) * n_out + o] : 0.0f;
      });
#pragma unroll
    for (int g = 0; g < kZGroup; ++g)
      if (z0 + g < splits)
        micro_tile_outputs(t0, o0, tx, ty, T, n_out,
                           [&](int i, int j, int, int64_t) { sum[i][j] += p[g][i][j]; });
  }
  micro_tile_outputs(t0, o0, tx, ty, T, n_out, [&](int i, int j, int t, int64_t o) {
    out[int64_t(t) * n_out + o] = sum[i][j];
  });
}

int64_t n_chunks(const QMatrix& w) {
  return (w.n_in + kChunk - 1) / kChunk;
}

int64_t tiles_o(const QMatrix& w) {
  return (w.n_out + kTileO - 1) / kTileO;
}

// Chunks per split for the shape: at least one, and splits that are never empty.
int chunks_per_split(const QMatrix& w, int target_blocks) {
  const int64_t target = target_blocks < 1 ? 1 : target_blocks;
  const int64_t want = (target + tiles_o(w) - 1) / tiles_o(w);
  const int64_t splits = want < 1 ? 1 : (want > n_chunks(w) ? n_chunks(w) : want);
  return static_cast<int>((n_chunks(w) + splits - 1) / splits);
}

template <QType kType>
cudaError_t launch_batched(QMatrix w, const float* x, int T, float* out, float* work,
                           unsigned* counters, cudaStream_t s, int target_blocks) {
  const bool split = work != nullptr && counters != nullptr;
  const int cps = split ? chunks_per_split(w, target_blocks) : static_cast<int>(n_chunks(w));
  const dim3 grid(static_cast<unsigned>(tiles_o(w)),
                  static_cast<unsigned>((T + kTileT - 1) / kTileT),
                  static_cast<unsigned>((n_chunks(w) + cps - 1) / cps));
  return launch(matmul_batched_kernel<kType>, grid, dim3(kThreads), 0, s,
                static_cast<const uint8_t*>(w.data), w.row_bytes, w.n_in, w.n_out, x, T, out, cps,
                work, counters);
}

}  // namespace

int matmul_batched_splits(QMatrix w, int target_blocks) {
  if (w.n_in <= 0 || w.n_out <= 0) return 1;
  const int cps = chunks_per_split(w, target_blocks);
  return static_cast<int>((n_chunks(w) + cps - 1) / cps);
}

int64_t matmul_batched_work_floats(QMatrix w, int T, int target_blocks) {
  const int splits = matmul_batched_splits(w, target_blocks);
  return splits > 1 ? int64_t(splits) * T * w.n_out : 0;
}

int matmul_batched_counters(QMatrix w, int T, int target_blocks) {
  return matmul_batched_splits(w, target_blocks) > 1
             ? static_cast<int>(tiles_o(w) * ((T + kTileT - 1) / kTileT))
             : 0;
}

bool matmul_batched_supported(QType t) {
  return qtype_supported(int(t));
}

cudaError_t matmul_batched(QMatrix w, const float* x, int T, float* out, float* work,
                           unsigned* counters, int target_blocks, cudaStream_t s) {
  if (T <= 0 || w.n_out == 0) return cudaSuccess;
  const int block = qtype_block_size(int(w.type));
  if (block <= 0 || w.n_in <= 0 || w.n_in % block != 0 || w.data == nullptr)
    return cudaErrorInvalidValue;
  switch (w.type) {
    case QType::F32:
      return launch_batched<QType::F32>(w, x, T, out, work, counters, s, target_blocks);
    case QType::F16:
      return launch_batched<QType::F16>(w, x, T, out, work, counters, s, target_blocks);
    case QType::BF16:
      return launch_batched<QType::BF16>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q4_0:
      return launch_batched<QType::Q4_0>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q4_1:
      return launch_batched<QType::Q4_1>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q5_0:
      return launch_batched<QType::Q5_0>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q5_1:
      return launch_batched<QType::Q5_1>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q8_0:
      return launch_batched<QType::Q8_0>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q4_K:
      return launch_batched<QType::Q4_K>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q5_K:
      return launch_batched<QType::Q5_K>(w, x, T, out, work, counters, s, target_blocks);
    case QType::Q6_K:
      return launch_batched<QType::Q6_K>(w, x, T, out, work, counters, s, target_blocks);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kvscope::cuda
