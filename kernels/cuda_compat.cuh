// cuda_compat.cuh — the one header every kernel source includes first.
//
// With KVSCOPE_CUDA_EMU defined (the emulated build, plain C++ under g++) it pulls in
// the CPU emulation layer from kernels/emu; otherwise NVIDIA's real headers for
// nvcc. Kernels use only what both builds provide: the CUDA built-ins, __half,
// warp shuffles, atomics, and the macros below.
#pragma once

#if defined(KVSCOPE_CUDA_EMU)
#include "kernels/emu/emu.h"
// Dynamic shared memory as a typed pointer; plain `extern __shared__` cannot be emulated.
#define KVSCOPE_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(::kvscope::emu::dynamic_smem())
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define KVSCOPE_DYN_SMEM(T, name)                                   \
  extern __shared__ __align__(16) unsigned char kvscope_dyn_smem_[]; \
  T* name = reinterpret_cast<T*>(kvscope_dyn_smem_)
#endif

namespace kvscope::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

}  // namespace kvscope::cuda
