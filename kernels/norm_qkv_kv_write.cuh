// norm_qkv_kv_write.cuh — the bodies of the fused way in to attention
// (norm_qkv_kv_write.cu): one warp's q/k/v product row over h (norm_qkv_row), and the
// epilogue one block runs once every row is done (norm_qkv_epilogue: x and h written back,
// biases, per-head q/k norms, RoPE, the K/V store, the stored rows' norms).
// Shapes: x, y, h [C]; q [H*D], k, v [Hkv*D]; cache K, V rows at the position's slot.
#pragma once

#include "kernels/kv_row_norms.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/residual_norm.cuh"
#include "kernels/rope_kv_write.cuh"

namespace kvscope::cuda {

// Adds bias b to n values of out (null b: nothing).
__device__ __forceinline__ void add_bias_block(float* out, const float* b, int n) {
  if (b == nullptr) return;
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] += b[i];
}

// RMSNorm of each of n_heads rows of D values of x, times w [D]; one head at a time.
__device__ __forceinline__ void head_norms_block(float* x, int n_heads, int D, const float* w,
                                                 float eps, float* scratch) {
  for (int h = 0; h < n_heads; ++h) {
    float* r = x + int64_t(h) * D;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) ss += r[d] * r[d];
    const float scale = rsqrtf(block_sum(ss, scratch) / static_cast<float>(D) + eps);
    for (int d = threadIdx.x; d < D; d += blockDim.x) r[d] = r[d] * scale * w[d];
  }
}

// Row o of the concatenation of Wq, Wk, Wv times hs [C] into q, k or v, by the calling warp
// (warp-uniform o; a warp with o past the end does nothing). Lane 0 stores.
__device__ __forceinline__ void norm_qkv_row(const QMatrix& wq, const QMatrix& wk,
                                             const QMatrix& wv, int C, const float* hs, float* q,
                                             float* k, float* v, int64_t o) {
  const int m = o < wq.n_out ? 0 : (o < wq.n_out + wk.n_out ? 1 : 2);
  o -= m == 0 ? 0 : (m == 1 ? wq.n_out : wq.n_out + wk.n_out);
  // Field by field (a reference to one of the three parameters would put them in local
  // memory).
  const uint8_t* wd = static_cast<const uint8_t*>(m == 0 ? wq.data : (m == 1 ? wk.data : wv.data));
  const int64_t n_out = m == 0 ? wq.n_out : (m == 1 ? wk.n_out : wv.n_out);
  const int64_t row_bytes = m == 0 ? wq.row_bytes : (m == 1 ? wk.row_bytes : wv.row_bytes);
  const QType type = m == 0 ? wq.type : (m == 1 ? wk.type : wv.type);
  if (o < n_out) {  // warp-uniform
    float acc[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots_any<true>(type, wd + o * row_bytes, C, hs, 1, acc);  // hs padded
    const float sum = warp_sum(acc[0]);
    if (threadIdx.x % 32 == 0) (m == 0 ? q : (m == 1 ? k : v))[o] = sum;
  }
}

// One block, once every q/k/v row is stored and every block has read x and y: x, h from
// the block's xs, hs; then biases, q/k norms, RoPE, the store, the row norms. Every thread
// of the block must call it.
template <class KE, class VE>
__device__ __forceinline__ void norm_qkv_epilogue(const ResidualArgs& r, const float* xs,
                                                  const float* hs, const QkvPost& p, float* q,
                                                  float* k, float* v, const KvLayer& kv,
                                                  uint8_t* kc, uint8_t* vc, float* scratch) {
  residual_norm_store(r, xs, hs);
  const int Hkv = kv.n_head_kv, D = kv.head_dim;
  add_bias_block(q, p.bq, p.H * D);
  add_bias_block(k, p.bk, Hkv * D);
  add_bias_block(v, p.bv, Hkv * D);
  __syncthreads();
  if (p.q_norm != nullptr) {
    head_norms_block(q, p.H, D, p.q_norm, r.eps, scratch);
    head_norms_block(k, Hkv, D, p.k_norm, r.eps, scratch);
  }
  __syncthreads();
  const int pos = p.pos0_dev != nullptr ? *p.pos0_dev : p.pos0;
  rope_kv_write_token<KE, VE>(q, k, v, p.H, p.rope, kv, 0, pos, kc, vc);
  if (p.k_row_norm == nullptr) return;  // the same for the whole block
  __syncthreads();                      // the stored rows, for every thread
  kv_row_norm_block<KE, VE>(kc, vc, kv, pos, p.k_row_norm, p.v_row_norm, scratch);
}

}  // namespace kvscope::cuda
