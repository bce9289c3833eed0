// norm_qkv_kv_write.cu — a decode step's way in to attention in one launch: the residual
// step (residual_norm.cuh), the q/k/v products, and in the last block to finish the
// biases, per-head q/k norms, RoPE, the K/V store and the stored rows' norms.
// Thread mapping: 256 threads; every block forms h in shared memory, then one warp per
// output row over the concatenated rows of Wq, Wk, Wv (8 rows per block, as
// matmul_qkv.cu; lane 0 stores). The last block (last_block.cuh) writes x and h back,
// then runs rope_kv_write's one-token body (rope_kv_write.cuh) and kv_row_norms' body
// (kv_row_norms.cuh), so the results equal the unfused ops'.
// Shapes: x, y, h [C]; q [H*D], k, v [Hkv*D]; cache K, V rows at the position's slot.
#include "kernels/kv_row_norms.cuh"
#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"
#include "kernels/matvec_row.cuh"
#include "kernels/residual_norm.cuh"
#include "kernels/rope_kv_write.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 32 * kMatvecWarpsPerBlock;
constexpr int kMaxWidth = 4096;  // 2 C floats of dynamic shared memory: 32 KiB

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

template <class KE, class VE>
__global__ void __launch_bounds__(kThreads)
    norm_qkv_kernel(ResidualArgs r, QMatrix wq, QMatrix wk, QMatrix wv, QkvPost p, float* q,
                    float* k, float* v, KvLayer kv, unsigned* counter, uint8_t* kc, uint8_t* vc) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  KVSCOPE_DYN_SMEM(float, xs);  // [C], then hs [C]
  float* hs = xs + r.C;
  __shared__ float scratch[32];
  __shared__ int last;
  residual_norm_block(r, xs, hs, scratch);
  // Row g of the concatenation; a warp past the end does no product but still arrives.
  int64_t o = int64_t(blockIdx.x) * kMatvecWarpsPerBlock + threadIdx.x / 32;
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
    lane_row_dots_any(type, wd + o * row_bytes, r.C, hs, 1, acc);
    const float sum = warp_sum(acc[0]);
    if (threadIdx.x % 32 == 0) (m == 0 ? q : (m == 1 ? k : v))[o] = sum;
  }
  if (!last_block_to_arrive(counter, gridDim.x, &last)) return;
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

}  // namespace

int residual_norm_max_width() {
  return kMaxWidth;
}

cudaError_t norm_qkv_kv_write(ResidualArgs r, QMatrix wq, QMatrix wk, QMatrix wv, QkvPost p,
                              float* q, float* k, float* v, KvLayer kv, unsigned* counter,
                              cudaStream_t s) {
  const QMatrix* ws[3] = {&wq, &wk, &wv};
  for (const QMatrix* w : ws)
    if (!matmul_native(w->type) || w->n_in != r.C) return cudaErrorInvalidValue;
  if (r.C <= 0 || r.C % 32 != 0 || r.C > kMaxWidth || counter == nullptr || p.H <= 0 ||
      p.rope.n_rot < 0 || p.rope.n_rot % 2 != 0 || p.rope.n_rot > kv.head_dim ||
      kv.n_head_kv <= 0 || kv.pos == nullptr || (kv.blocks == nullptr && kv.n_slots <= kv.sink) ||
      wq.n_out != int64_t(p.H) * kv.head_dim || wk.n_out != int64_t(kv.n_head_kv) * kv.head_dim ||
      wv.n_out != wk.n_out)
    return cudaErrorInvalidValue;
  const int64_t rows = wq.n_out + wk.n_out + wv.n_out;
  const dim3 grid(static_cast<unsigned>((rows + kMatvecWarpsPerBlock - 1) / kMatvecWarpsPerBlock));
  const size_t smem = size_t(2) * r.C * sizeof(float);
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(norm_qkv_kernel<KE, VE>, grid, dim3(kThreads), smem, s, r, wq, wk, wv, p, q, k, v,
                  kv, counter, static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v));
  });
}

}  // namespace kvscope::cuda
