// attention.cu — causal grouped-query attention over the KV cache, for decode (T = 1)
// and prefill / NO CACHE (T > 1); also writes the last query's probability row.
// Thread mapping: one block per (query head h, query row t), 4 warps. Scores: one warp
// per key (lanes split D, shuffle reduction) into dynamic shared memory [N]; softmax
// with block max/sum; output: threads stride over D, each summing p_j * V[j][d].
// Shapes: q [T][H*D] fp32; cache K, V [Hkv][capacity][D] (fp16 or fp32); out [T][H*D];
// probs_last [H][probs_stride] (first pos0+T entries written), query t sees keys
// [0, pos0 + t]. The graph form (attention_dev) reads pos0 from device memory and sizes
// shared memory for the cache capacity, so one captured launch serves every step.
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope_cuda {
namespace {

int g_max_smem_bytes = 48 * 1024;

struct AttnShape {
  int T, pos0, H, Hkv, D, cap;
  float scale;
  int64_t probs_stride;  // < 0: rows are pos0 + T apart, starting at row probs_row0
  int64_t probs_row0;
};

template <class KT>
__global__ void __launch_bounds__(128)
    attention_kernel(const float* q, const KT* kc, const KT* vc, AttnShape sh, float* out,
                     float* probs_last, const int* pos0_dev) {
  KVSCOPE_DYN_SMEM(float, scores);  // [n]
  __shared__ float scratch[32];
  if (pos0_dev != nullptr) {  // graph replay: the position lives in device memory
    sh.pos0 = *pos0_dev;
    if (sh.probs_stride < 0) {
      sh.probs_stride = sh.pos0 + sh.T;
      if (probs_last != nullptr) probs_last += sh.probs_row0 * sh.probs_stride;
    }
  }
  const int h = blockIdx.x, t = blockIdx.y;
  const int hk = h / (sh.H / sh.Hkv);
  const int n = sh.pos0 + t + 1;
  const int D = sh.D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const float* qv = q + (int64_t(t) * sh.H + h) * D;
  const KT* K = kc + int64_t(hk) * sh.cap * D;
  const KT* V = vc + int64_t(hk) * sh.cap * D;

  for (int j = warp; j < n; j += n_warps) {
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += qv[d] * static_cast<float>(K[int64_t(j) * D + d]);
    acc = warp_sum(acc);
    if (lane == 0) scores[j] = acc * sh.scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, scores[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = __expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);  // its barriers also publish the exp() writes
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < n; j += blockDim.x) scores[j] *= inv;
  __syncthreads();
  if (probs_last != nullptr && t == sh.T - 1)
    for (int j = threadIdx.x; j < n; j += blockDim.x) probs_last[h * sh.probs_stride + j] = scores[j];
  float* o = out + (int64_t(t) * sh.H + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += scores[j] * static_cast<float>(V[int64_t(j) * D + d]);
    o[d] = acc;
  }
}

cudaError_t launch_attention(const float* q, KvLayer kv, AttnShape sh, int smem_keys, float* out,
                             float* probs, const int* pos0_dev, cudaStream_t s) {
  const dim3 grid(sh.H, sh.T);
  const size_t smem = size_t(smem_keys) * sizeof(float);
  if (kv.f16)
    return launch(attention_kernel<__half>, grid, dim3(128), smem, s, q,
                  static_cast<const __half*>(kv.k), static_cast<const __half*>(kv.v), sh, out,
                  probs, pos0_dev);
  return launch(attention_kernel<float>, grid, dim3(128), smem, s, q,
                static_cast<const float*>(kv.k), static_cast<const float*>(kv.v), sh, out, probs,
                pos0_dev);
}

}  // namespace

int attention_max_keys() { return g_max_smem_bytes / 4; }

cudaError_t kernels_init() {
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, 0)) return e;
  const int optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  const int want = optin > 48 * 1024 ? optin - 1024 : 48 * 1024;  // room for static smem
  if (want > 48 * 1024) {
    if (cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(attention_kernel<__half>),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, want))
      return e;
    if (cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(attention_kernel<float>),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, want))
      return e;
  }
  g_max_smem_bytes = want;
  return cudaSuccess;
}

cudaError_t attention(const float* q, KvLayer kv, int T, int pos0, int n_head, float* out,
                      float* probs_last, int64_t probs_stride, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const int n_keys = pos0 + T;
  if (n_keys > attention_max_keys()) return cudaErrorInvalidValue;
  AttnShape sh{T, pos0, n_head, kv.n_head_kv, kv.head_dim, kv.capacity,
               1.0f / sqrtf(static_cast<float>(kv.head_dim)), probs_stride, 0};
  return launch_attention(q, kv, sh, n_keys, out, probs_last, nullptr, s);
}

cudaError_t attention_dev(const float* q, KvLayer kv, int T, const int* pos0_dev, int n_head,
                          float* out, float* probs_base, int64_t probs_row0, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (pos0_dev == nullptr || kv.capacity > attention_max_keys()) return cudaErrorInvalidValue;
  AttnShape sh{T, 0, n_head, kv.n_head_kv, kv.head_dim, kv.capacity,
               1.0f / sqrtf(static_cast<float>(kv.head_dim)), -1, probs_row0};
  return launch_attention(q, kv, sh, kv.capacity, out, probs_base, pos0_dev, s);
}

}  // namespace kvscope_cuda
