// rope.cu — rotary position embedding, adjacent pairs (2i, 2i+1) ("normal" llama mode).
// Thread mapping: one block per token; threads stride over (head, pair) of that row.
// The angle is formed in double (kernels/rope_kv.cuh).
// Shapes: x [T][n_heads*D] fp32 in place; the first n_rot (even) dims of a head rotate.
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope_cuda {
namespace {

__global__ void rope_kernel(float* x, int n_heads, int D, int n_rot, int pos0, float base) {
  const int t = blockIdx.x;
  const int half = n_rot / 2;
  float* row = x + int64_t(t) * n_heads * D;
  for (int e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    float c, s;
    rope_cos_sin(pos0 + t, i, n_rot, base, &c, &s);
    rope_rotate(row + h * D + 2 * i, c, s);
  }
}

}  // namespace

cudaError_t rope(float* x, int T, int n_heads, int D, int n_rot, int pos0, float base,
                 cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const int work = n_heads * (n_rot / 2);
  const int threads = work >= 256 ? 256 : (work + 31) / 32 * 32;
  return launch(rope_kernel, dim3(T), dim3(threads > 0 ? threads : 32), 0, s, x, n_heads, D,
                n_rot, pos0, base);
}

}  // namespace kvscope_cuda
