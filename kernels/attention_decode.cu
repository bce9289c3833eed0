// attention_decode.cu — attention of one query row (a decode step) split over the cache's
// slots, so a long cache keeps the whole GPU busy instead of one block per head.
// attention_decode is one launch, grid (H, n_chunks), 128 threads: each block scores
// kDecodeChunk slots of one head (slots spread over the warps, lanes split D), keeps the
// raw scores for the probability row, and writes its chunk's max m, sum of exp(s - m) and
// the partial output sum exp(s - m) * V [D]. The last block of a head to finish (a
// per-head counter, after a __threadfence) then merges that head's chunks in chunk order
// (the usual log-sum-exp merge; which block merges does not change the result), writes
// out [H*D] and the probability row by position, and puts the counter back to zero.
// Work layout (floats): scores [H][n_slots], m [H][nc], l [H][nc], o [H][nc][D].
// Visibility (empty slots, future positions, the window) is kv_layout.cuh's rule, as in
// attention.cu; the graph form reads pos0 from device memory. attention_rows runs the
// split and the merge as two launches for B decode rows of different sequences (grid z /
// y = the row), each over its own block table and slot map. K and V rows are each f32,
// f16, q8_0 or q4_0, read value by value through kernels/kv_quant.cuh.
#include "kernels/attention_decode.cuh"
#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

using namespace decode_attn;

// Row b's share of the rows' work memory: m [H][nc], l [H][nc], o [H][nc][D], no scores.
__device__ __forceinline__ Work rows_work(float* work, int b, int H, int nc, int D) {
  Work w;
  w.scores = nullptr;
  w.m = work + int64_t(b) * H * nc * (2 + D);
  w.l = w.m + int64_t(H) * nc;
  w.o = w.l + int64_t(H) * nc;
  return w;
}

// The row's layer: the shared fields with the row's table, slot map and slot count.
__device__ __forceinline__ KvLayer row_layer(const KvLayer& kv, const KvRowRef& r) {
  KvLayer kl = kv;
  kl.blocks = r.blocks;
  kl.pos = r.pos;
  kl.n_slots = r.n_slots;
  return kl;
}

// Pass 1 of B rows: grid (H, chunks of the longest row, B); a block past its row's last
// chunk returns at once (the whole block: no barrier is left waiting).
template <class KE, class VE>
__global__ void __launch_bounds__(kThreads)
    attn_rows_partial(const float* q, const uint8_t* kc, const uint8_t* vc, KvLayer kv,
                      const KvRowRef* rows, DecodeShape sh, float* work) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float qs[kMaxD];
  __shared__ float p[kDecodeChunk];
  __shared__ float part[kThreads];
  __shared__ float scratch[32];
  __shared__ int64_t row_of[kDecodeChunk];
  const int b = blockIdx.z;
  const KvRowRef r = rows[b];
  if (int(blockIdx.y) * kDecodeChunk >= r.n_slots) return;
  const KvLayer kl = row_layer(kv, r);
  const Work wk = rows_work(work, b, sh.H, sh.nc, kv.head_dim);
  decode_partial<KE, VE>(q + int64_t(b) * sh.H * kv.head_dim, kc, vc, kl, sh, wk, r.query,
                         blockIdx.x, blockIdx.y, PartialSmem{qs, p, part, scratch, row_of});
}

// Pass 2 of B rows: grid (H, B); row b merges its own chunks into row b of out.
__global__ void __launch_bounds__(kThreads)
    attn_rows_combine(const KvRowRef* rows, DecodeShape sh, int D, float* work, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float scratch[32];
  const int h = blockIdx.x, b = blockIdx.y;
  const int count = (rows[b].n_slots + kDecodeChunk - 1) / kDecodeChunk;
  const Work wk = rows_work(work, b, sh.H, sh.nc, D);
  float mx, inv;
  decode_merge(wk, h, sh.nc, count, D, out + int64_t(b) * sh.H * D, scratch, &mx, &inv);
}

template <class KE, class VE>
__global__ void __launch_bounds__(kThreads)
    attn_decode_kernel(const float* q, const uint8_t* kc, const uint8_t* vc, KvLayer kv,
                       DecodeShape sh, Work wk, const int* pos0_dev, float* out, float* probs,
                       unsigned* counters) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float qs[kMaxD];
  __shared__ float p[kDecodeChunk];
  __shared__ float part[kThreads];
  __shared__ float scratch[32];
  __shared__ int64_t rows[kDecodeChunk];
  __shared__ int last;
  const int qp = pos0_dev != nullptr ? *pos0_dev : sh.pos0;
  const int h = blockIdx.x;
  decode_partial<KE, VE>(q, kc, vc, kv, sh, wk, qp, h, blockIdx.y,
                         PartialSmem{qs, p, part, scratch, rows});
  if (!last_block_to_arrive(counters + h, gridDim.y, &last)) return;
  decode_combine(kv, sh, wk, h, qp, out, probs, scratch);
}

}  // namespace

int64_t attention_decode_work_floats(int n_head, KvLayer kv) {
  const int64_t nc = (kv.n_slots + kDecodeChunk - 1) / kDecodeChunk;
  return int64_t(n_head) * kv.n_slots + int64_t(n_head) * nc * (2 + kv.head_dim);
}

cudaError_t attention_decode(const float* q, KvLayer kv, int pos0, const int* pos0_dev,
                             int n_head, float scale, float* out, float* probs,
                             int64_t probs_stride, int64_t probs_row0, float* work,
                             unsigned* counters, cudaStream_t s) {
  if (kv.pos == nullptr || kv.n_head_kv <= 0 || n_head % kv.n_head_kv != 0 || kv.n_slots <= 0 ||
      kv.head_dim <= 0 || kv.head_dim > kMaxD || work == nullptr || counters == nullptr)
    return cudaErrorInvalidValue;
  const int nc = (kv.n_slots + kDecodeChunk - 1) / kDecodeChunk;
  const DecodeShape sh{pos0, n_head, nc, scale, probs_stride, probs_row0};
  const Work wk = carve(work, n_head, kv.n_slots, nc, kv.head_dim);
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(attn_decode_kernel<KE, VE>, dim3(n_head, nc), dim3(kThreads), 0, s, q,
                  static_cast<const uint8_t*>(kv.k), static_cast<const uint8_t*>(kv.v), kv, sh,
                  wk, pos0_dev, out, probs, counters);
  });
}

int64_t attention_rows_work_floats(int B, int n_head, KvLayer kv, int max_slots) {
  const int64_t nc = (max_slots + kDecodeChunk - 1) / kDecodeChunk;
  return int64_t(B) * n_head * nc * (2 + kv.head_dim);
}

cudaError_t attention_rows(const float* q, KvLayer kv, const KvRowRef* rows, int B, int max_slots,
                           int n_head, float scale, float* out, float* work, cudaStream_t s) {
  if (B <= 0) return cudaSuccess;
  if (rows == nullptr || kv.block <= 0 || kv.n_head_kv <= 0 || n_head % kv.n_head_kv != 0 ||
      max_slots <= 0 || kv.head_dim <= 0 || kv.head_dim > kMaxD || work == nullptr)
    return cudaErrorInvalidValue;
  const int nc = (max_slots + kDecodeChunk - 1) / kDecodeChunk;
  const DecodeShape sh{0, n_head, nc, scale, 0, 0};
  const cudaError_t e = kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(attn_rows_partial<KE, VE>, dim3(n_head, nc, B), dim3(kThreads), 0, s, q,
                  static_cast<const uint8_t*>(kv.k), static_cast<const uint8_t*>(kv.v), kv, rows,
                  sh, work);
  });
  if (e != cudaSuccess) return e;
  return launch(attn_rows_combine, dim3(n_head, B), dim3(kThreads), 0, s, rows, sh, kv.head_dim,
                work, out);
}

}  // namespace kvscope::cuda
