// act.cuh — the FFN gate activations, shared by glu.cu and the fused gate/up matvec so
// both compute them with the same float operations.
// silu(g) = g / (1 + exp(-g)); gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

namespace kvscope::cuda {

__device__ __forceinline__ float gate_act(GateAct act, float g) {
  if (act == GateAct::GeluTanh)
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return g / (1.0f + __expf(-g));
}

}  // namespace kvscope::cuda
