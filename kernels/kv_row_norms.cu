// kv_row_norms.cu — L2 norm of each stored K and V row (all kv heads of one position), which
// colours the cache blocks in the scene.
// Thread mapping: one block per position; threads stride over (kv head, d); two block sums.
// Shapes: cache K, V [Hkv][n_slots] rows of any cache type (kv_quant.cuh); k_norm, v_norm [T] for positions pos0 + t (read
// from their slots, kv_layout.cuh).
#include "kernels/kv_row_norms.cuh"
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

template <class KE, class VE>
__global__ void kv_row_norms_kernel(const uint8_t* kc, const uint8_t* vc, KvLayer kv, int pos0,
                                const int* pos0_dev, float* k_norm, float* v_norm) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float scratch[32];
  const int p = (pos0_dev != nullptr ? *pos0_dev : pos0) + static_cast<int>(blockIdx.x);
  kv_row_norm_block<KE, VE>(kc, vc, kv, p, k_norm + blockIdx.x, v_norm + blockIdx.x, scratch);
}

}  // namespace

cudaError_t kv_row_norms(KvLayer kv, int pos0, const int* pos0_dev, int T, float* k_norm,
                     float* v_norm, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (kv.blocks == nullptr && kv.n_slots <= kv.sink) return cudaErrorInvalidValue;
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(kv_row_norms_kernel<KE, VE>, dim3(T), dim3(128), 0, s,
                  static_cast<const uint8_t*>(kv.k), static_cast<const uint8_t*>(kv.v), kv, pos0,
                  pos0_dev, k_norm, v_norm);
  });
}

}  // namespace kvscope::cuda
