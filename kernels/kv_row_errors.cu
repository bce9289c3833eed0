// kv_row_errors.cu — the quantization error of the K and V rows just stored: for each
// position, ||x - x'|| / ||x|| over all kv heads, x the f32 row kv_write received and x'
// the stored row read back (kv_quant.cuh); 0 for a zero row. Colours the cache blocks
// when the app asks for it (Backend::kv_row_errors; the CPU backend computes the same).
// Thread mapping: one block per position; threads stride over (kv head, d); four block
// sums (fp32; the CPU sums in fp64, which moves the ratio by ~1e-6 relative).
// Shapes: k, v [T][Hkv*D] fp32; cache K, V [Hkv][n_slots] rows of any cache type, read
// from the slots of positions pos0 + t (kv_layout.cuh); k_err, v_err [T].
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

template <class KE, class VE>
__global__ void kv_row_errors_kernel(const float* k, const float* v, const uint8_t* kc,
                                     const uint8_t* vc, KvLayer kv, int pos0, const int* pos0_dev,
                                     float* k_err, float* v_err) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float scratch[32];
  const int D = kv.head_dim, W = kv.n_head_kv * D;
  const int t = static_cast<int>(blockIdx.x);
  const int slot = kv_slot(kv, (pos0_dev != nullptr ? *pos0_dev : pos0) + t);
  float dk = 0.0f, rk = 0.0f, dv = 0.0f, rv = 0.0f;
  for (int e = threadIdx.x; e < W; e += blockDim.x) {
    const int64_t row = kv_row(kv, e / D, slot);
    const float xk = k[int64_t(t) * W + e], xv = v[int64_t(t) * W + e];
    const float ek = xk - KE::load(kc + row * KE::row_bytes(D), e % D);
    const float ev = xv - VE::load(vc + row * VE::row_bytes(D), e % D);
    dk += ek * ek;
    rk += xk * xk;
    dv += ev * ev;
    rv += xv * xv;
  }
  dk = block_sum(dk, scratch);
  rk = block_sum(rk, scratch);
  dv = block_sum(dv, scratch);
  rv = block_sum(rv, scratch);
  if (threadIdx.x == 0) {
    k_err[t] = rk > 0.0f ? sqrtf(dk / rk) : 0.0f;
    v_err[t] = rv > 0.0f ? sqrtf(dv / rv) : 0.0f;
  }
}

}  // namespace

cudaError_t kv_row_errors(KvLayer kv, const float* k, const float* v, int T, int pos0,
                          const int* pos0_dev, float* k_err, float* v_err, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (kv.blocks == nullptr && kv.n_slots <= kv.sink) return cudaErrorInvalidValue;
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(kv_row_errors_kernel<KE, VE>, dim3(T), dim3(128), 0, s, k, v,
                  static_cast<const uint8_t*>(kv.k), static_cast<const uint8_t*>(kv.v), kv, pos0,
                  pos0_dev, k_err, v_err);
  });
}

}  // namespace kvscope::cuda
