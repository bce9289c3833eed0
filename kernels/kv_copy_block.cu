// kv_copy_block.cu — the KV block pool's copies, each in one launch over every layer, K
// and V, every kv head (one device copy per layer, side and head was 180 calls from the
// host for SmolLM2):
//   kv_copy_block  copy-on-write of one block: block src's rows onto block dst's;
//   kv_move_rows   the context shift's row moves, in order.
// Thread mapping: one thread block per (buffer, kv head). kv_copy_block's threads copy the
// block's B rows, which are contiguous (B * row bytes, a multiple of 16), 16 bytes at a
// time; kv_move_rows' threads copy one move at a time in the widest unit that divides the
// row bytes, with a barrier between moves (a move may read what an earlier one wrote).
// Shapes: buffer i (p.bases[i]) is [Hkv][rows][row bytes of side i % 2]; block b of a
// head is its rows [b * B, (b + 1) * B).
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 128;

template <class U>
__device__ void copy_units(uint8_t* to, const uint8_t* from, int64_t bytes) {
  U* t = reinterpret_cast<U*>(to);
  const U* f = reinterpret_cast<const U*>(from);
  for (int64_t j = threadIdx.x; j < bytes / int64_t(sizeof(U)); j += blockDim.x) t[j] = f[j];
}

// This thread block's kv head in its buffer (blockIdx.x = buffer * Hkv + head) and the
// buffer's row bytes. The side's row bytes are selected, not indexed: a parameter array
// indexed at run time would go to the stack.
struct BlockHead {
  uint8_t* head;
  int64_t rb;
};
__device__ BlockHead block_head(const KvPoolCopy& p) {
  const int i = static_cast<int>(blockIdx.x) / p.n_head_kv;
  const int h = static_cast<int>(blockIdx.x) % p.n_head_kv;
  const int64_t rb = i % 2 != 0 ? p.row_bytes[1] : p.row_bytes[0];
  return {static_cast<uint8_t*>(p.bases[i]) + int64_t(h) * p.rows * rb, rb};
}

__global__ void __launch_bounds__(kThreads) kv_copy_block_kernel(KvPoolCopy p, int dst, int src) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const BlockHead bh = block_head(p);
  const int64_t bytes = int64_t(p.block) * bh.rb;
  copy_units<uint4>(bh.head + int64_t(dst) * bytes, bh.head + int64_t(src) * bytes, bytes);
}

__global__ void __launch_bounds__(kThreads)
    kv_move_rows_kernel(KvPoolCopy p, const KvRowMove* moves, int n_moves) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const BlockHead bh = block_head(p);
  uint8_t* head = bh.head;
  const int64_t rb = bh.rb;
  // Every offset and size is a multiple of rb (and the buffers are 256-byte aligned).
  const int unit = rb % 16 == 0 ? 16 : rb % 8 == 0 ? 8 : rb % 4 == 0 ? 4 : rb % 2 == 0 ? 2 : 1;
  for (int m = 0; m < n_moves; ++m) {
    const KvRowMove mv = moves[m];
    uint8_t* to = head + int64_t(mv.dst) * rb;
    const uint8_t* from = head + int64_t(mv.src) * rb;
    const int64_t bytes = int64_t(mv.n) * rb;
    switch (unit) {  // uniform across the block
      case 16:
        copy_units<uint4>(to, from, bytes);
        break;
      case 8:
        copy_units<uint2>(to, from, bytes);
        break;
      case 4:
        copy_units<uint32_t>(to, from, bytes);
        break;
      case 2:
        copy_units<uint16_t>(to, from, bytes);
        break;
      default:
        copy_units<uint8_t>(to, from, bytes);
        break;
    }
    __syncthreads();  // this move's rows are written before the next move reads
  }
}

}  // namespace

namespace {

bool valid(const KvPoolCopy& p) {
  return p.bases != nullptr && p.n_bases > 0 && p.n_bases % 2 == 0 && p.n_head_kv > 0 &&
         p.block > 0 && p.rows >= p.block && p.row_bytes[0] > 0 && p.row_bytes[1] > 0;
}

}  // namespace

cudaError_t kv_move_rows(const KvPoolCopy& p, const KvRowMove* moves, int n_moves, cudaStream_t s) {
  if (n_moves <= 0) return cudaSuccess;
  if (!valid(p) || moves == nullptr) return cudaErrorInvalidValue;
  return launch(kv_move_rows_kernel, dim3(unsigned(p.n_bases * p.n_head_kv)), dim3(kThreads), 0, s,
                p, moves, n_moves);
}

cudaError_t kv_copy_block(const KvPoolCopy& p, int dst, int src, cudaStream_t s) {
  const int64_t blocks = p.block > 0 ? p.rows / p.block : 0;
  if (!valid(p) || dst < 0 || src < 0 || dst >= blocks || src >= blocks ||
      int64_t(p.block) * p.row_bytes[0] % 16 != 0 || int64_t(p.block) * p.row_bytes[1] % 16 != 0)
    return cudaErrorInvalidValue;
  if (dst == src) return cudaSuccess;
  return launch(kv_copy_block_kernel, dim3(unsigned(p.n_bases * p.n_head_kv)), dim3(kThreads), 0, s,
                p, dst, src);
}

}  // namespace kvscope::cuda
