// kv_rerotate.cu — the context shift's re-rotation: in one layer of the KV cache, every
// K row whose slot holds a position >= first rotates in place by `delta` positions (the
// pair rotation of rope() at pos = delta), stored back in the K element type (fp16 rounded
// to nearest; q8_0 / q4_0 requantized as a whole row, as the CPU does: dequantize, rotate,
// quantize, kernels/kv_quant.cuh). RoPE is a rotation, so a row rotated at p and then by
// -n equals the row rotated at p - n up to rounding.
// Thread mapping: one block per slot, 128 threads; for each kv head the row is read into
// shared memory [D] (dynamic), its pairs rotate (threads stride over pairs), and the
// block's warps store it back 32 values at a time. Empty slots (pos -1) and positions
// below first are left alone.
// Shapes: cache K [Hkv][n_slots] rows; pos [n_slots].
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"
#include "kernels/rope_kv.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 128;

template <class KE>
__global__ void __launch_bounds__(kThreads)
    kv_rerotate_kernel(uint8_t* kc, KvLayer kv, RopeArgs r, int first, int delta) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  KVSCOPE_DYN_SMEM(float, x);  // [D]
  const int slot = static_cast<int>(blockIdx.x);
  if (kv.pos[slot] < first || kv.pos[slot] < 0) return;  // the same for the whole block
  const int D = kv.head_dim, half = r.n_rot / 2, lane = static_cast<int>(threadIdx.x % 32);
  const int64_t rb = KE::row_bytes(D);
  for (int h = 0; h < kv.n_head_kv; ++h) {
    uint8_t* row = kc + kv_row(kv, h, slot) * rb;
    for (int d = threadIdx.x; d < D; d += blockDim.x) x[d] = KE::load(row, d);
    __syncthreads();
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float c, s;
      int a, b;
      rope_cos_sin(delta, i, r, &c, &s);
      rope_pair(r, i, &a, &b);
      rope_rotate(x + a, x + b, c, s);
    }
    __syncthreads();
    for (int d0 = int(threadIdx.x / 32) * 32; d0 < D; d0 += blockDim.x)  // warp-uniform
      KE::store32(row, d0, d0 + lane < D ? x[d0 + lane] : 0.0f, d0 + lane < D);
    __syncthreads();  // x is reused by the next head
  }
}

}  // namespace

cudaError_t kv_rerotate(KvLayer kv, RopeArgs r, int first, int delta, cudaStream_t s) {
  if (kv.n_slots <= 0) return cudaSuccess;
  if (r.n_rot < 0 || r.n_rot % 2 != 0 || r.n_rot > kv.head_dim || first < 0 || kv.head_dim > 8192)
    return cudaErrorInvalidValue;
  if (kv.n_head_kv * (r.n_rot / 2) == 0) return cudaSuccess;
  return kv_dispatch_k(kv, [&](auto kt) {
    using KE = typename decltype(kt)::type;
    return launch(kv_rerotate_kernel<KE>, dim3(kv.n_slots), dim3(kThreads),
                  size_t(kv.head_dim) * sizeof(float), s, static_cast<uint8_t*>(kv.k), kv, r, first,
                  delta);
  });
}

}  // namespace kvscope::cuda
