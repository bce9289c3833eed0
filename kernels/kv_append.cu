// kv_append.cu — store this step's K and V rows into the layer's cache (fp16 or fp32).
// Thread mapping: grid-stride loop, one thread per stored value (t, kv head, d).
// Shapes: k, v [T][Hkv*D] fp32 -> cache K, V [Hkv][capacity][D] at positions pos0 + t.
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope_cuda {
namespace {

template <class KT>
__global__ void kv_append_kernel(const float* k, const float* v, int T, int Hkv, int D, int cap,
                                 int pos0, KT* kc, KT* vc) {
  const int64_t total = int64_t(T) * Hkv * D;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t t = e / (int64_t(Hkv) * D);
    const int r = static_cast<int>(e % (int64_t(Hkv) * D));
    const int h = r / D, d = r % D;
    const int64_t dst = (int64_t(h) * cap + pos0 + t) * D + d;
    kc[dst] = to_cache<KT>(k[e]);
    vc[dst] = to_cache<KT>(v[e]);
  }
}

}  // namespace

cudaError_t kv_append(KvLayer kv, const float* k, const float* v, int T, int pos0,
                      cudaStream_t s) {
  const int64_t total = int64_t(T) * kv.n_head_kv * kv.head_dim;
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  const dim3 grid(unsigned(blocks < 4096 ? blocks : 4096));
  if (kv.f16)
    return launch(kv_append_kernel<__half>, grid, dim3(256), 0, s, k, v, T, kv.n_head_kv,
                  kv.head_dim, kv.capacity, pos0, static_cast<__half*>(kv.k),
                  static_cast<__half*>(kv.v));
  return launch(kv_append_kernel<float>, grid, dim3(256), 0, s, k, v, T, kv.n_head_kv,
                kv.head_dim, kv.capacity, pos0, static_cast<float*>(kv.k),
                static_cast<float*>(kv.v));
}

}  // namespace kvscope_cuda
