// attention_decode.cuh — the bodies of the split decode attention (attention_decode.cu):
// decode_partial scores one chunk of kDecodeChunk slots of one head and keeps its max, sum
// and partial output; decode_merge / decode_combine merge a head's chunks in chunk order.
// Thread mapping: kThreads = 128 threads (slots over the warps, lanes split D). Every
// thread of the block must call them.
// Work layout (floats): scores [H][n_slots], m [H][nc], l [H][nc], o [H][nc][D].
#pragma once

#include "kernels/kv_layout.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda::decode_attn {

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

__host__ __device__ inline Work carve(float* w, int H, int n, int nc, int D) {
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

}  // namespace kvscope::cuda::decode_attn
