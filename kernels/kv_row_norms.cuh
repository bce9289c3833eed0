// kv_row_norms.cuh — the L2 norms of one stored position's K and V rows (all kv heads) by
// one block, shared by kv_row_norms.cu and norm_qkv_kv_write.cu (its last block).
// Threads stride over (kv head, d); two block sums; thread 0 writes. Every thread of the
// block must call it (block_sum holds barriers); blockDim.x a multiple of 32.
#pragma once

#include "kernels/kv_layout.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {

template <class KE, class VE>
__device__ __forceinline__ void kv_row_norm_block(const uint8_t* kc, const uint8_t* vc,
                                                  const KvLayer& kv, int p, float* k_norm,
                                                  float* v_norm, float* scratch) {
  const int D = kv.head_dim;
  const int slot = kv_slot(kv, p);
  float sk = 0.0f, sv = 0.0f;
  for (int e = threadIdx.x; e < kv.n_head_kv * D; e += blockDim.x) {
    const int64_t row = kv_row(kv, e / D, slot);
    const float a = KE::load(kc + row * KE::row_bytes(D), e % D);
    const float b = VE::load(vc + row * VE::row_bytes(D), e % D);
    sk += a * a;
    sv += b * b;
  }
  sk = block_sum(sk, scratch);
  sv = block_sum(sv, scratch);
  if (threadIdx.x == 0) {
    *k_norm = sqrtf(sk);
    *v_norm = sqrtf(sv);
  }
}

}  // namespace kvscope::cuda
