// attention.cu — grouped-query attention over the KV cache, for decode (T = 1) and
// prefill / NO CACHE (T > 1); also writes the last query's probability row by position.
// Thread mapping: one block per (query head h, query row t), 4 warps. Scores: one warp
// per slot (lanes split D, shuffle reduction) into dynamic shared memory [n_slots], -inf
// for slots the query does not see (empty, future, outside the window: kv_layout.cuh);
// softmax with block max/sum; output: threads stride over D, each summing p_j * V[j][d]
// over the seen slots.
// Shapes: q [T][H*D] fp32; cache K, V [Hkv][n_slots] rows (each f32, f16, q8_0 or q4_0,
// read value by value through kernels/kv_quant.cuh) with the slot
// map kv.pos; out [T][H*D]; probs_last [H][probs_stride], entries [0, pos0+T) written by
// position. The graph form (attention_dev) reads pos0 from device memory, so one
// captured launch serves every step.
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/reduce.cuh"

namespace kvscope::cuda {
namespace {

int g_max_smem_bytes = 48 * 1024;

struct AttnShape {
  int T, pos0, H;
  float scale;
  int64_t probs_stride;  // < 0: rows are pos0 + T apart, starting at row probs_row0
  int64_t probs_row0;
};

template <class KE, class VE>
__global__ void __launch_bounds__(128)
    attention_kernel(const float* q, const uint8_t* kc, const uint8_t* vc, KvLayer kv, AttnShape sh,
                     float* out, float* probs_last, const int* pos0_dev) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  KVSCOPE_DYN_SMEM(float, scores);  // [n_slots]
  __shared__ float scratch[32];
  if (pos0_dev != nullptr) {  // graph replay: the position lives in device memory
    sh.pos0 = *pos0_dev;
    if (sh.probs_stride < 0) {
      sh.probs_stride = sh.pos0 + sh.T;
      if (probs_last != nullptr) probs_last += sh.probs_row0 * sh.probs_stride;
    }
  }
  const int h = blockIdx.x, t = blockIdx.y;
  const int hk = h / (sh.H / kv.n_head_kv);
  const int qp = sh.pos0 + t;
  const int n = kv.n_slots;
  const int D = kv.head_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const float* qv = q + (int64_t(t) * sh.H + h) * D;
  const int64_t krb = KE::row_bytes(D), vrb = VE::row_bytes(D);

  for (int j = warp; j < n; j += n_warps) {
    if (!kv_visible(kv, kv.pos[j], qp)) {  // the same for every lane of the warp
      if (lane == 0) scores[j] = -INFINITY;
      continue;
    }
    float acc = 0.0f;
    const uint8_t* kj = kc + kv_row(kv, hk, j) * krb;
    for (int d = lane; d < D; d += 32) acc += qv[d] * KE::load(kj, d);
    acc = warp_sum(acc);
    if (lane == 0) scores[j] = acc * sh.scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, scores[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = scores[j] == -INFINITY ? 0.0f : __expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = block_sum(sum, scratch);  // its barriers also publish the exp() writes
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < n; j += blockDim.x) scores[j] *= inv;
  __syncthreads();
  if (probs_last != nullptr && t == sh.T - 1) {  // the same for the whole block
    float* row = probs_last + h * sh.probs_stride;
    for (int j = threadIdx.x; j < sh.pos0 + sh.T; j += blockDim.x) row[j] = 0.0f;
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x)
      if (kv_visible(kv, kv.pos[j], qp)) row[kv.pos[j]] = scores[j];
  }
  float* o = out + (int64_t(t) * sh.H + h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float p = scores[j];
      if (p != 0.0f) acc += p * VE::load(vc + kv_row(kv, hk, j) * vrb, d);  // unseen: skipped
    }
    o[d] = acc;
  }
}

cudaError_t launch_attention(const float* q, KvLayer kv, AttnShape sh, float* out, float* probs,
                             const int* pos0_dev, cudaStream_t s) {
  const dim3 grid(sh.H, sh.T);
  const size_t smem = size_t(kv.n_slots) * sizeof(float);
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(attention_kernel<KE, VE>, grid, dim3(128), smem, s, q,
                  static_cast<const uint8_t*>(kv.k), static_cast<const uint8_t*>(kv.v), kv, sh,
                  out, probs, pos0_dev);
  });
}

// Raises the limit of every K/V type combination's instantiation.
cudaError_t raise_smem(int bytes) {
  for (KvElem kt : {KvElem::F32, KvElem::F16, KvElem::Q8_0, KvElem::Q4_0})
    for (KvElem vt : {KvElem::F32, KvElem::F16, KvElem::Q8_0, KvElem::Q4_0}) {
      KvLayer kv;
      kv.k_type = kt;
      kv.v_type = vt;
      kv.head_dim = 32;
      const cudaError_t e = kv_dispatch(kv, [&](auto k, auto v) {
        using KE = typename decltype(k)::type;
        using VE = typename decltype(v)::type;
        return cudaFuncSetAttribute(reinterpret_cast<const void*>(attention_kernel<KE, VE>),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      });
      if (e != cudaSuccess) return e;
    }
  return cudaSuccess;
}

}  // namespace

int attention_max_keys() { return g_max_smem_bytes / 4; }

cudaError_t kernels_init() {
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, 0)) return e;
  const int optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  const int want = optin > 48 * 1024 ? optin - 1024 : 48 * 1024;  // room for static smem
  if (want > 48 * 1024) {
    if (cudaError_t e = raise_smem(want)) return e;
  }
  g_max_smem_bytes = want;
  return cudaSuccess;
}

cudaError_t attention(const float* q, KvLayer kv, int T, int pos0, int n_head, float scale,
                      float* out, float* probs_last, int64_t probs_stride, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (kv.n_slots > attention_max_keys() || kv.pos == nullptr || kv.n_head_kv <= 0 ||
      n_head % kv.n_head_kv != 0)
    return cudaErrorInvalidValue;
  AttnShape sh{T, pos0, n_head, scale, probs_stride, 0};
  return launch_attention(q, kv, sh, out, probs_last, nullptr, s);
}

cudaError_t attention_dev(const float* q, KvLayer kv, int T, const int* pos0_dev, int n_head,
                          float scale, float* out, float* probs_base, int64_t probs_row0,
                          cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (pos0_dev == nullptr || kv.n_slots > attention_max_keys() || kv.pos == nullptr ||
      kv.n_head_kv <= 0 || n_head % kv.n_head_kv != 0)
    return cudaErrorInvalidValue;
  AttnShape sh{T, 0, n_head, scale, -1, probs_row0};
  return launch_attention(q, kv, sh, out, probs_base, pos0_dev, s);
}

}  // namespace kvscope::cuda
