// kv_norms.cu — L2 norm of each stored K and V row (all kv heads of one position), which
// colours the cache blocks in the scene.
// Thread mapping: one block per position; threads stride over (kv head, d); two block sums.
// Shapes: cache K, V [Hkv][capacity][D]; k_norm, v_norm [T] for positions pos0 + t.
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope_cuda {
namespace {

template <class KT>
__global__ void kv_norms_kernel(const KT* kc, const KT* vc, int Hkv, int D, int cap, int pos0,
                                const int* pos0_dev, float* k_norm, float* v_norm) {
  __shared__ float scratch[32];
  const int p = (pos0_dev != nullptr ? *pos0_dev : pos0) + static_cast<int>(blockIdx.x);
  float sk = 0.0f, sv = 0.0f;
  for (int e = threadIdx.x; e < Hkv * D; e += blockDim.x) {
    const int64_t idx = (int64_t(e / D) * cap + p) * D + e % D;
    const float a = static_cast<float>(kc[idx]), b = static_cast<float>(vc[idx]);
    sk += a * a;
    sv += b * b;
  }
  sk = block_sum(sk, scratch);
  sv = block_sum(sv, scratch);
  if (threadIdx.x == 0) {
    k_norm[blockIdx.x] = sqrtf(sk);
    v_norm[blockIdx.x] = sqrtf(sv);
  }
}

}  // namespace

cudaError_t kv_norms(KvLayer kv, int pos0, int T, float* k_norm, float* v_norm, cudaStream_t s,
                     const int* pos0_dev) {
  if (T <= 0) return cudaSuccess;
  if (kv.f16)
    return launch(kv_norms_kernel<__half>, dim3(T), dim3(128), 0, s,
                  static_cast<const __half*>(kv.k), static_cast<const __half*>(kv.v),
                  kv.n_head_kv, kv.head_dim, kv.capacity, pos0, pos0_dev, k_norm, v_norm);
  return launch(kv_norms_kernel<float>, dim3(T), dim3(128), 0, s, static_cast<const float*>(kv.k),
                static_cast<const float*>(kv.v), kv.n_head_kv, kv.head_dim, kv.capacity, pos0,
                pos0_dev, k_norm, v_norm);
}

}  // namespace kvscope_cuda
