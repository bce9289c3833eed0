// decode_persistent.cu — a whole decode step (one token, batch 1) in one cooperative launch:
// an experiment against the graphed path (CudaBackendOptions::persistent, off by default;
// scripts/device_check.sh measures both on a GPU). kernels.h DecodeStepArgs lists what it
// takes.
// Thread mapping: 256 threads per block (the fused kernels' block), grid = at most the
// blocks that can be resident at once. Phases, each a grid-stride loop over its work items,
// a grid barrier (cuda_compat.cuh grid_sync) after each:
//   embed              value i of the token's row (embed.cu's body)
//   per layer l:
//   A  qkv             every block forms x', h in shared memory (residual_norm_block),
//                      then groups of 8 q/k/v rows, one warp per row (norm_qkv_row)
//   B  qkv epilogue    block 0: x, h stored, biases, q/k norms, RoPE, K/V store, row norms
//   C  attention       (head, chunk) items: decode_partial, as attention_decode's blocks
//   D  merge           one head per item: decode_combine (and the probability row)
//   E  Wo              one warp per output row (matmul.cu's row: lane_row_dots + warp_sum)
//   F  ffn             every block forms x', h again, then 32-value gate slices
//                      (norm_ffn_slice)
//   G  ffn sum         value c of the down product summed over slices (norm_ffn_sum);
//                      block 0 stores x, h
//   final              block 0: add + RMSNorm as add_rmsnorm's block (add_rmsnorm.cuh)
//   head               one warp per logit row
// So 7 L + 2 grid barriers per step. Each body is the one the separate kernels run, with
// the same per-item thread mapping, so the step is bit-identical to theirs (the tests
// assert it). Only f16 K/V caches are compiled in; the backend checks the rest.
#include "kernels/add_rmsnorm.cuh"
#include "kernels/attention_decode.cuh"
#include "kernels/launch.cuh"
#include "kernels/norm_ffn.cuh"
#include "kernels/norm_qkv_kv_write.cuh"
#include "kernels/quant.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 32 * kMatvecWarpsPerBlock;  // 256
constexpr int kWarps = kMatvecWarpsPerBlock;
static_assert(kThreads >= decode_attn::kThreads, "the attention bodies need 128 threads");

using decode_attn::DecodeShape;
using decode_attn::PartialSmem;
using decode_attn::Work;

// Dynamic shared memory: xs [C], hs [padded_len(C)] (residual_norm.cuh); the final
// norm's 1024 partials reuse it.
size_t smem_bytes(int C) {
  const int64_t floats = C + padded_len(C) > 1024 ? C + padded_len(C) : 1024;
  return size_t(floats) * sizeof(float);
}

// out[o] = W row o · x for every row, one warp per row over the grid.
__device__ __forceinline__ void matvec_rows(const QMatrix& w, const float* x, float* out) {
  const int lane = threadIdx.x % 32;
  const auto* wd = static_cast<const uint8_t*>(w.data);
  for (int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; o < w.n_out;
       o += int64_t(gridDim.x) * kWarps) {  // warp-uniform
    float acc[kRowsAtOnce] = {0.0f, 0.0f, 0.0f, 0.0f};
    lane_row_dots_any(w.type, wd + o * w.row_bytes, w.n_in, x, 1, acc);
    const float v = warp_sum(acc[0]);
    if (lane == 0) out[o] = v;
  }
}

template <class KE, class VE>
__device__ __forceinline__ void run_layer(const DecodeLayerArgs& a, int pos, float* xs, float* hs,
                                          float* scratch, float* g, PartialSmem att_smem) {
  const int64_t grid_warps = int64_t(gridDim.x) * kWarps;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  auto* kc = static_cast<uint8_t*>(a.kv.k);
  auto* vc = static_cast<uint8_t*>(a.kv.v);
  // A: the residual step in every block (block 0's xs, hs are stored in B), q/k/v rows.
  residual_norm_block(a.attn_in, xs, hs, scratch);
  const int64_t qkv_rows = a.wq.n_out + a.wk.n_out + a.wv.n_out;
  // Whole groups of 8 rows per block, as norm_qkv_kv_write's blocks take them.
  for (int64_t o = warp0; o < (qkv_rows + kWarps - 1) / kWarps * kWarps; o += grid_warps)
    norm_qkv_row(a.wq, a.wk, a.wv, a.attn_in.C, hs, a.q, a.k, a.v, o);
  grid_sync();
  // B: one block finishes q, k, v and stores the row.
  if (blockIdx.x == 0)
    norm_qkv_epilogue<KE, VE>(a.attn_in, xs, hs, a.post, a.q, a.k, a.v, a.kv, kc, vc, scratch);
  grid_sync();
  // C: the split attention's (head, chunk) items.
  const int H = a.post.H;
  const int nc = (a.kv.n_slots + decode_attn::kDecodeChunk - 1) / decode_attn::kDecodeChunk;
  const DecodeShape sh{0, H, nc, a.attn_scale, -1, a.probs_row0};
  const Work wk = decode_attn::carve(a.attn_work, H, a.kv.n_slots, nc, a.kv.head_dim);
  for (int item = blockIdx.x; item < H * nc; item += gridDim.x) {
    decode_attn::decode_partial<KE, VE, true>(a.q, kc, vc, a.kv, sh, wk, pos, item % H, item / H,
                                              att_smem);
    __syncthreads();  // the next item rewrites the shared rows and scores
  }
  grid_sync();
  // D: each head's chunks merged in chunk order, and its probability row.
  for (int h = blockIdx.x; h < H; h += gridDim.x) {
    decode_attn::decode_combine<true>(a.kv, sh, wk, h, pos, a.att, a.probs, scratch);
    __syncthreads();  // the next head rewrites scratch
  }
  grid_sync();
  // E: o = Wo · att.
  matvec_rows(a.wo, a.att, a.o);
  grid_sync();
  // F: the residual step again in every block, then the gate slices.
  residual_norm_block(a.ffn_in, xs, hs, scratch);
  const int64_t slices = a.w_gate.n_out / kFfnSlice;
  for (int64_t sl = blockIdx.x; sl < slices; sl += gridDim.x) {
    norm_ffn_slice(a.w_gate, a.w_up, a.w_down, a.act, a.ffn_in.C, hs, sl, g, a.ffn_work);
    __syncthreads();  // the next slice rewrites g
  }
  grid_sync();
  // G: the down product (out may be y: every block has read y in F), x and h.
  const int C = a.ffn_in.C;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x)
    a.ffn_out[c] = norm_ffn_sum(a.ffn_work, unsigned(slices), C, c);
  if (blockIdx.x == 0) residual_norm_store(a.ffn_in, xs, hs);
  grid_sync();
}

template <class KE, class VE>
__global__ void __launch_bounds__(kThreads) decode_persistent_kernel(DecodeStepArgs s) {
  KVSCOPE_DYN_SMEM(float, xs);  // [C], then hs [padded_len(C)]
  float* hs = xs + s.C;
  __shared__ float scratch[32];
  __shared__ float g[kFfnSlice];
  __shared__ float qs[decode_attn::kMaxD];
  __shared__ float p[decode_attn::kDecodeChunk];
  __shared__ float part[decode_attn::kThreads];
  __shared__ int64_t rows[decode_attn::kDecodeChunk];
  const PartialSmem att_smem{qs, p, part, scratch, rows};
  const int pos = *s.pos0_dev;
  // The embedding (embed.cu: value i of the token's row times the scale).
  const auto* row =
      static_cast<const uint8_t*>(s.tok_embd.data) + int64_t(*s.token) * s.tok_embd.row_bytes;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < s.C; i += gridDim.x * blockDim.x)
    s.x[i] = dequant_value(s.tok_embd.type, row, i) * s.embd_scale;
  grid_sync();
  for (int l = 0; l < s.n_layer; ++l)
    run_layer<KE, VE>(s.layers[l], pos, xs, hs, scratch, g, att_smem);
  // The final add + RMSNorm (one block, as add_rmsnorm's one block per row), the LM head.
  const ResidualArgs& f = s.final_norm;
  if (blockIdx.x == 0) add_rmsnorm_row_as_block(f.x, f.y, f.w, f.C, f.eps, f.h, xs, scratch);
  grid_sync();
  matvec_rows(s.head, f.h, s.logits);
}

}  // namespace

int decode_persistent_max_blocks() {
  // The largest width the fused kernels take (their shared memory), for the occupancy query.
  return cooperative_grid_limit(decode_persistent_kernel<KvF16, KvF16>, kThreads,
                                smem_bytes(residual_norm_max_width()));
}

cudaError_t decode_persistent(DecodeStepArgs s, int blocks, cudaStream_t st) {
  if (s.C <= 0 || s.C % 32 != 0 || s.C > residual_norm_max_width() || s.n_layer <= 0 ||
      s.layers == nullptr || s.token == nullptr || s.pos0_dev == nullptr || s.x == nullptr ||
      !matmul_native(s.head.type) || s.head.n_in != s.C || s.logits == nullptr ||
      s.final_norm.x == nullptr || s.final_norm.y == nullptr || s.final_norm.h == nullptr ||
      s.final_norm.C != s.C || blocks <= 0)
    return cudaErrorInvalidValue;
  return launch_cooperative(decode_persistent_kernel<KvF16, KvF16>, dim3(unsigned(blocks)),
                            dim3(kThreads), smem_bytes(s.C), st, s);
}

}  // namespace kvscope::cuda
