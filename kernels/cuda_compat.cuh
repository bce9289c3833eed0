// cuda_compat.cuh — the one header every kernel source includes first.
//
// With KVSCOPE_CUDA_EMU defined (the emulated build, plain C++ under g++) it pulls in
// the CPU emulation layer from kernels/emu; otherwise NVIDIA's real headers for
// nvcc. Kernels use only what both builds provide: the CUDA built-ins, __half,
// warp shuffles, atomics, and the macros and helpers below.
//
// Programmatic dependent launch (PDL, sm_90+; kernels/launch.cuh): a kernel launched with
// the attribute may start while the previous kernel in the stream still runs, so every
// kernel calls grid_dependency_wait() as its first statement, before it touches global
// memory. The wait returns once the previous grid has completed and its writes are
// visible (that grid waited on its own predecessor first, so the whole stream before it
// is done too). grid_dependents_launch() then lets the next kernel start launching: its
// blocks only take free SM slots and block in their own wait, so the trigger's place does
// not change results, only how early the next launch's setup overlaps this one.
//
// Grid-wide barrier (cooperative launch only, kernels/launch.cuh launch_cooperative):
// grid_sync() returns once every thread of every block of the grid has called it, with
// every global write made before the call visible to every thread after it. In a kernel
// not launched cooperatively it is undefined on a GPU (a hang, typically); the emulator
// fails such a launch with a message.
#pragma once

#if defined(KVSCOPE_CUDA_EMU)
#include "kernels/emu/emu.h"
// Dynamic shared memory as a typed pointer; plain `extern __shared__` cannot be emulated.
#define KVSCOPE_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(::kvscope::emu::dynamic_smem())
#else
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define KVSCOPE_DYN_SMEM(T, name)                                   \
  extern __shared__ __align__(16) unsigned char kvscope_dyn_smem_[]; \
  T* name = reinterpret_cast<T*>(kvscope_dyn_smem_)
#endif

namespace kvscope::cuda {

inline constexpr unsigned kFullMask = 0xffffffffu;

#if defined(KVSCOPE_CUDA_EMU)
// The emulator records that the calling thread waited: a launch with the PDL attribute in
// which some thread never called it fails (on a GPU it would be a silent race).
inline void grid_dependency_wait() {
  ::kvscope::emu::grid_dependency_wait();
}
inline void grid_dependents_launch() {}
inline void grid_sync() {
  ::kvscope::emu::grid_sync();
}
#else
__device__ __forceinline__ void grid_sync() {
  cooperative_groups::this_grid().sync();
}
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();  // griddepcontrol.wait
#endif
}
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
#endif

}  // namespace kvscope::cuda
