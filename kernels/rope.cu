// rope.cu — rotary position embedding, adjacent pairs (2i, 2i+1) (llama files) or NeoX
// halves (i, i + n_rot/2) (gemma3, qwen2), with linear position scaling.
// Thread mapping: one block per token; threads stride over (head, pair) of that row.
// The angle is formed in double (kernels/rope_kv.cuh).
// Shapes: x [T][n_heads*D] fp32 in place; the first n_rot (even) dims of a head rotate.
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope::cuda {
namespace {

__global__ void rope_kernel(float* x, int n_heads, int D, RopeArgs r, int pos0) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int t = blockIdx.x;
  const int half = r.n_rot / 2;
  float* row = x + int64_t(t) * n_heads * D;
  for (int e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    float c, s;
    int a, b;
    rope_cos_sin(pos0 + t, i, r, &c, &s);
    rope_pair(r, i, &a, &b);
    rope_rotate(row + h * D + a, row + h * D + b, c, s);
  }
}

}  // namespace

cudaError_t rope(float* x, int T, int n_heads, int D, RopeArgs r, int pos0, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > D) return cudaErrorInvalidValue;
  const int work = n_heads * (r.n_rot / 2);
  const int threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
  return launch(rope_kernel, dim3(T), dim3(threads > 0 ? threads : 32), 0, s, x, n_heads, D, r,
                pos0);
}

}  // namespace kvscope::cuda
