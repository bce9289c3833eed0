// kv_copy_block.cu — copy-on-write of one block of the KV block pool: block src's rows
// onto block dst's in every layer, K and V, every kv head, in one launch (one device copy
// per layer, side and head was 180 calls from the host for SmolLM2).
// Thread mapping: one thread block per (buffer, kv head); its threads copy the block's B
// rows, which are contiguous (B * row bytes, a multiple of 16), 16 bytes at a time.
// Shapes: buffer i (p.bases[i]) is [Hkv][rows][row bytes of side i % 2]; block b of a
// head is its rows [b * B, (b + 1) * B).
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) kv_copy_block_kernel(KvPoolCopy p, int dst, int src) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int i = static_cast<int>(blockIdx.x) / p.n_head_kv;
  const int h = static_cast<int>(blockIdx.x) % p.n_head_kv;
  // Selected, not indexed: a parameter array indexed at run time would go to the stack.
  const bool v = i % 2 != 0;
  const int64_t bytes = v ? p.block_bytes[1] : p.block_bytes[0];
  const int64_t head_bytes = v ? p.head_bytes[1] : p.head_bytes[0];
  uint8_t* head = static_cast<uint8_t*>(p.bases[i]) + int64_t(h) * head_bytes;
  const uint4* from = reinterpret_cast<const uint4*>(head + int64_t(src) * bytes);
  uint4* to = reinterpret_cast<uint4*>(head + int64_t(dst) * bytes);
  for (int64_t j = threadIdx.x; j < bytes / 16; j += blockDim.x) to[j] = from[j];
}

}  // namespace

cudaError_t kv_copy_block(const KvPoolCopy& p, int dst, int src, cudaStream_t s) {
  if (p.bases == nullptr || p.n_bases <= 0 || p.n_bases % 2 != 0 || p.n_head_kv <= 0 || dst < 0 ||
      src < 0)
    return cudaErrorInvalidValue;
  for (int side = 0; side < 2; ++side)
    if (p.block_bytes[side] <= 0 || p.block_bytes[side] % 16 != 0 ||
        p.head_bytes[side] < p.block_bytes[side] * (int64_t(dst > src ? dst : src) + 1))
      return cudaErrorInvalidValue;
  if (dst == src) return cudaSuccess;
  return launch(kv_copy_block_kernel, dim3(unsigned(p.n_bases * p.n_head_kv)), dim3(kThreads), 0, s,
                p, dst, src);
}

}  // namespace kvscope::cuda
