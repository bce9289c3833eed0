// kv_write.cu — store this step's K and V rows into the layer's cache (each side f32,
// f16, q8_0 or q4_0: kernels/kv_quant.cuh) at their positions' slots, and record the
// positions in the slot map.
// Thread mapping: grid-stride loop, one warp per 32 consecutive values of a row (t, kv
// head, d0): the block types quantize those 32 values as one block; lane 0 of the chunk
// (t, 0, 0) writes the map entry.
// Shapes: k, v [T][Hkv*D] fp32 -> cache K, V [Hkv][n_slots] rows at kv_slot(pos0 + t).
#include "kernels/kv_layout.cuh"
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 256;

template <class KE, class VE>
__global__ void kv_write_kernel(const float* k, const float* v, int T, KvLayer kv, int pos0,
                                 uint8_t* kc, uint8_t* vc) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int Hkv = kv.n_head_kv, D = kv.head_dim, nch = (D + 31) / 32;
  const int64_t chunks = int64_t(T) * Hkv * nch;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int64_t krb = KE::row_bytes(D), vrb = VE::row_bytes(D);
  for (int64_t c = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; c < chunks;
       c += warps) {  // the same for every lane of the warp
    const int64_t t = c / (int64_t(Hkv) * nch);
    const int r = static_cast<int>(c % (int64_t(Hkv) * nch));
    const int h = r / nch, d0 = (r % nch) * 32, d = d0 + lane;
    const bool valid = d < D;
    const int pos = pos0 + static_cast<int>(t);
    const int slot = kv_slot(kv, pos);
    const int64_t src = (t * Hkv + h) * D + d;
    const int64_t row = kv_row(kv, h, slot);
    KE::store32(kc + row * krb, d0, valid ? k[src] : 0.0f, valid);
    VE::store32(vc + row * vrb, d0, valid ? v[src] : 0.0f, valid);
    if (r == 0 && lane == 0) kv.pos[slot] = pos;
  }
}

}  // namespace

cudaError_t kv_write(KvLayer kv, const float* k, const float* v, int T, int pos0, cudaStream_t s) {
  const int64_t chunks = int64_t(T) * kv.n_head_kv * ((kv.head_dim + 31) / 32);
  if (chunks <= 0) return cudaSuccess;
  if (kv.pos == nullptr || (kv.blocks == nullptr && kv.n_slots <= kv.sink)) return cudaErrorInvalidValue;
  const int64_t blocks = (chunks + kThreads / 32 - 1) / (kThreads / 32);
  const dim3 grid(unsigned(blocks < 4096 ? blocks : 4096));
  return kv_dispatch(kv, [&](auto kt, auto vt) {
    using KE = typename decltype(kt)::type;
    using VE = typename decltype(vt)::type;
    return launch(kv_write_kernel<KE, VE>, grid, dim3(kThreads), 0, s, k, v, T, kv, pos0,
                  static_cast<uint8_t*>(kv.k), static_cast<uint8_t*>(kv.v));
  });
}

}  // namespace kvscope::cuda
