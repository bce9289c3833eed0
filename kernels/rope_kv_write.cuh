// rope_kv_write.cuh — one token's RoPE + K/V store by one block, shared by
// rope_kv_write.cu (a block per token) and norm_qkv_kv_write.cu (the last block of the
// fused decode-step kernel), so both rotate and store bit-identically.
// Thread mapping: see rope_kv_write.cu. Every thread of the block must call it (it holds
// a barrier).
#pragma once

#include "kernels/kv_layout.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope::cuda {

// One token: row t of q, k, v at position pos, stored through `kv` (the rows' layer).
template <class KE, class VE>
__device__ __forceinline__ void rope_kv_write_token(float* q, float* k, const float* v, int H,
                                                    const RopeArgs& rp, const KvLayer& kv, int t,
                                                    int pos, uint8_t* kc, uint8_t* vc) {
  const int Hkv = kv.n_head_kv, D = kv.head_dim;
  const int slot = kv_slot(kv, pos);
  const int half = rp.n_rot / 2;
  const int n_q = H * half;
  float* qr = q + int64_t(t) * H * D;
  float* kr = k + int64_t(t) * Hkv * D;
  const float* vr = v + int64_t(t) * Hkv * D;
  for (int e = threadIdx.x; e < n_q + Hkv * half; e += blockDim.x) {
    float c, s;
    int a, b;
    const bool is_q = e < n_q;
    const int r = is_q ? e : e - n_q;
    const int h = r / half, i = r % half;
    float* x = is_q ? qr + h * D : kr + h * D;
    rope_cos_sin(pos, i, rp, &c, &s);
    rope_pair(rp, i, &a, &b);
    rope_rotate(x + a, x + b, c, s);
  }
  __syncthreads();  // the rotated k rows, for every warp of the block
  const int nch = (D + 31) / 32, lane = static_cast<int>(threadIdx.x % 32);
  const int64_t krb = KE::row_bytes(D), vrb = VE::row_bytes(D);
  for (int c = threadIdx.x / 32; c < 2 * Hkv * nch; c += blockDim.x / 32) {  // warp-uniform
    const bool is_k = c < Hkv * nch;
    const int r = is_k ? c : c - Hkv * nch;
    const int h = r / nch, d0 = (r % nch) * 32, d = d0 + lane;
    const bool valid = d < D;
    const int64_t row = kv_row(kv, h, slot);
    if (is_k)
      KE::store32(kc + row * krb, d0, valid ? kr[h * D + d] : 0.0f, valid);
    else
      VE::store32(vc + row * vrb, d0, valid ? vr[h * D + d] : 0.0f, valid);
  }
  if (threadIdx.x == 0) kv.pos[slot] = pos;
}

}  // namespace kvscope::cuda
