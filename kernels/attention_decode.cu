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
#include "kernels/kv_layout.cuh"
#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kDecodeChunk = 32;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxD = 512;

struct DecodeShape {
  int pos0, H, nc;
  float scale;
  int64_t probs_stride;  // < 0: rows pos0 + 1 apart, starting at row probs_row0
  int64_t probs_row0;
};

struct Work {
  float *scores, *m, *l, *o;
};

Work carve(float* w, int H, int n, int nc, int D) {
  Work k;
  k.scores = w;
  k.m = k.scores + int64_t(H) * n;
  k.l = k.m + int64_t(H) * nc;
  k.o = k.l + int64_t(H) * nc;
  (void)D;
  return k;
}

// The block's shared memory, declared by each kernel and handed to the bodies.
struct PartialSmem {
  float *qs, *p, *part, *scratch;
  int64_t* rows;  // [kDecodeChunk]
};

// Pass 1 for head h, chunk c of one query row at position qp (sh.nc: the chunk stride of
// m, l, o; wk.scores may be null: no raw scores kept).
template <class KE, class VE>
__device__ __forceinline__ void decode_partial(const float* q, const uint8_t* kc, const uint8_t* vc,
                                               const KvLayer& kv, const DecodeShape& sh,
                                               const Work& wk, int qp, int h, int c,
                                               PartialSmem sm) {
  float* qs = sm.qs;
  float* p = sm.p;
  float* part = sm.part;
  float* scratch = sm.scratch;
  int64_t* rows = sm.rows;  // the chunk's rows in the K/V stores
  const int hk = h / (sh.H / kv.n_head_kv);
  const int n = kv.n_slots, D = kv.head_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j0 = c * kDecodeChunk, len = n - j0 < kDecodeChunk ? n - j0 : kDecodeChunk;
  const int64_t krb = KE::row_bytes(D), vrb = VE::row_bytes(D);
  for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[int64_t(h) * D + d];
  // Each slot's row once (a paged cache's goes through the block table), not once per
  // value read.
  for (int jl = threadIdx.x; jl < kDecodeChunk; jl += blockDim.x)
    rows[jl] = kv_row(kv, hk, j0 + (jl < len ? jl : len - 1));
  __syncthreads();
  // Scores: warp w takes slots w, w + kWarps, ...; all its rows' loads are issued together
  // (slots past the chunk's end read the last slot and are dropped below).
  constexpr int kPerWarp = kDecodeChunk / kWarps;
  float acc[kPerWarp];
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) acc[i] = 0.0f;
  for (int d = lane; d < D; d += 32) {
    const float qd = qs[d];
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int jl = warp + i * kWarps;
      acc[i] += qd * KE::load(kc + rows[jl] * krb, d);
    }
  }
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int jl = warp + i * kWarps;
    const float dot = warp_sum(acc[i]);
    if (lane == 0) {
      const bool seen = jl < len && kv_visible(kv, kv.pos[j0 + jl], qp);
      const float s = seen ? dot * sh.scale : -INFINITY;
      p[jl] = s;
      if (jl < len && wk.scores != nullptr) wk.scores[int64_t(h) * n + j0 + jl] = s;
    }
  }
  __syncthreads();
  float mx = threadIdx.x < kDecodeChunk ? p[threadIdx.x] : -INFINITY;
  mx = block_max(mx, scratch);
  float e = 0.0f;
  if (threadIdx.x < kDecodeChunk) {
    e = p[threadIdx.x] == -INFINITY ? 0.0f : __expf(p[threadIdx.x] - mx);
    p[threadIdx.x] = e;
  }
  const float sum = block_sum(e, scratch);  // its barriers also publish the exp() writes
  // Output: G groups of threads split the chunk's slots for each of D dims (G = 2 for
  // D = 64), four independent sums each; unseen slots (p = 0) add nothing, even if their
  // rows hold NaN.
  const int G = D < kThreads ? kThreads / D : 1;
  const int g = threadIdx.x / (D < kThreads ? D : kThreads);
  float* o = wk.o + (int64_t(h) * sh.nc + c) * D;
  for (int d = threadIdx.x % (D < kThreads ? D : kThreads); d < D; d += kThreads) {
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (g < G) {
      for (int jl = g; jl < len; jl += 4 * G) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = jl + u * G;
          if (j < len) {
            const float pj = p[j];
            const float v = VE::load(vc + rows[j] * vrb, d);
            a[u] += pj != 0.0f ? pj * v : 0.0f;
          }
        }
      }
    }
    const float mine = (a[0] + a[1]) + (a[2] + a[3]);
    if (G == 1) {
      o[d] = mine;
    } else {
      part[threadIdx.x] = mine;
      __syncthreads();
      if (g == 0) {
        float t = mine;
        for (int gg = 1; gg < G; ++gg) t += part[gg * D + d];
        o[d] = t;
      }
    }
  }
  if (threadIdx.x == 0) {
    wk.m[int64_t(h) * sh.nc + c] = mx;
    wk.l[int64_t(h) * sh.nc + c] = sum;
  }
}

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

// Pass 2's merge for head h: the first `count` chunks of m, l, o (chunk stride nc) into
// out [H*D]; the global max and 1/sum for the probability row.
__device__ __forceinline__ void decode_merge(const Work& wk, int h, int nc, int count, int D,
                                             float* out, float* scratch, float* mx_out,
                                             float* inv_out) {
  const float* m = wk.m + int64_t(h) * nc;
  const float* l = wk.l + int64_t(h) * nc;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < count; c += blockDim.x) mx = fmaxf(mx, m[c]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < count; c += blockDim.x)
    if (m[c] != -INFINITY) sum += l[c] * __expf(m[c] - mx);
  sum = block_sum(sum, scratch);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const float* o = wk.o + int64_t(h) * nc * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int c = 0; c < count; ++c)
      if (m[c] != -INFINITY) acc += o[int64_t(c) * D + d] * __expf(m[c] - mx);
    out[int64_t(h) * D + d] = acc * inv;
  }
  *mx_out = mx;
  *inv_out = inv;
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

// The merge of head h into out and its probability row (the block that finished last).
__device__ __forceinline__ void decode_combine(const KvLayer& kv, DecodeShape sh, const Work& wk,
                                               int h, int qp, float* out, float* probs,
                                               float* scratch) {
  const int n = kv.n_slots;
  if (sh.probs_stride < 0) {  // the graph form: rows qp + 1 apart from row probs_row0
    sh.probs_stride = qp + 1;
    if (probs != nullptr) probs += sh.probs_row0 * sh.probs_stride;
  }
  float mx, inv;
  decode_merge(wk, h, sh.nc, sh.nc, kv.head_dim, out, scratch, &mx, &inv);
  if (probs == nullptr) return;  // the same for the whole block
  float* row = probs + h * sh.probs_stride;
  for (int j = threadIdx.x; j <= qp; j += blockDim.x) row[j] = 0.0f;
  __syncthreads();
  const float* s = wk.scores + int64_t(h) * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    if (kv_visible(kv, kv.pos[j], qp)) row[kv.pos[j]] = __expf(s[j] - mx) * inv;
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
