// glu.cu — the gated FFN activation: out = act(gate) * up, act SiLU or tanh-GELU (act.cuh).
// Thread mapping: grid-stride loop, one thread per element.
// Shapes: gate, up, out [T][F] fp32 flattened to n; out may alias gate.
#include "kernels/act.cuh"
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

__global__ void glu_kernel(const float* gate, const float* up, int64_t n, GateAct act, float* out) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = gate_act(act, gate[i]) * up[i];
}

}  // namespace

cudaError_t glu(const float* gate, const float* up, int64_t n, GateAct act, float* out,
                cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256;
  return launch(glu_kernel, dim3(unsigned(blocks < 4096 ? blocks : 4096)), dim3(256), 0, s, gate,
                up, n, act, out);
}

}  // namespace kvscope::cuda
