// emu.h — CUDA-on-CPU emulation layer: device built-ins for kernels compiled as C++.
//
// kernels/cuda_compat.cuh includes this header when KVSCOPE_CUDA_EMU is defined. The
// same .cu sources then compile with g++ against NVIDIA's headers (types, __half,
// enums) plus this layer: every CUDA thread is a fiber, the threads of a block run
// round-robin on one OS worker thread, blocks are spread over a small worker pool.
// Built-ins (threadIdx, blockIdx, blockDim, gridDim) are thread_local variables the
// scheduler sets before it resumes a fiber; __shared__ becomes thread_local (one copy
// per worker = one per resident block). Warp operations go through one exchange step
// that checks masks the way the hardware requires them to be used. Misuse (a lane
// outside its own mask, reading an inactive lane, a deadlock) fails the launch with a
// report instead of hanging or silently computing garbage.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

// ---- built-in variables ---------------------------------------------------------
// Inline variables, defined here: an access is one %fs-relative load. Declared extern and
// defined in emu_fiber.cpp they were reached through the GOT, and UBSan's null check on
// that address broke under the linker's TLS relaxation (add x@gottpoff becomes a lea,
// which sets no flags, so the check branched on stale ones): a false 'member access within
// null pointer' in every kernel.
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

// __shared__ from NVIDIA's host headers expands to nothing, which would silently make
// every "shared" array a per-thread local. thread_local at block scope is static
// storage per OS worker thread: one copy per block in flight, shared by its fibers.
#undef __shared__
#define __shared__ thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace kvscope::emu {

// Thrown inside a fiber for device-side misuse; the launch fails with the message.
struct DeviceFault {
  std::string message;
};
[[noreturn]] void device_fault(const std::string& message);
// The fault of a shuffle width that is not a power of two in [1, 32]. Out of line: built
// inline, its message gave every shuffle a stack frame that ASan poisons at each call.
[[noreturn]] void fault_shuffle_width(int width);

// Dynamic shared memory of the running block (filled with 0xFF before each block).
unsigned char* dynamic_smem();

enum class WarpOp : int { kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kSync };
// One exchange among the lanes of `mask`. For shuffles, b is the lane / delta / xor
// mask and c the PTX clamp word; returns the value read. For kBallot, value is the
// predicate and the result the ballot bits.
uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int b, int c);
unsigned active_mask();

void syncthreads();
int syncthreads_reduce(int predicate, int kind);  // kind 0 count, 1 and, 2 or
// kvscope::cuda::grid_dependency_wait(): records that the calling thread waited for the
// previous grid (the launch is synchronous here, so there is nothing to wait for).
void grid_dependency_wait();
// kvscope::cuda::grid_sync(): the grid-wide barrier of a cooperative launch. Every thread of
// the block arrives (a block-level barrier), then the block waits at an OS-level barrier for
// every other block of the grid; writes before it are visible to every thread after it. In a
// launch that is not cooperative it fails the launch (on a GPU it would hang or be
// undefined); a block that exits or fails while others wait fails the launch too.
void grid_sync();

inline int shfl_clamp(int width, bool up) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) fault_shuffle_width(width);
  return ((32 - width) << 8) | (up ? 0 : 0x1f);
}

template <class T>
T shfl(WarpOp op, unsigned mask, T var, int b, int c) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8,
                "warp shuffles move at most 8 bytes of a trivially copyable type");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warp_exchange(op, mask, bits, b, c);
  T out;
  std::memcpy(static_cast<void*>(&out), &bits, sizeof(T));
  return out;
}

}  // namespace kvscope::emu

// ---- synchronisation ------------------------------------------------------------
inline void __syncthreads() { kvscope::emu::syncthreads(); }
inline int __syncthreads_count(int p) { return kvscope::emu::syncthreads_reduce(p, 0); }
inline int __syncthreads_and(int p) { return kvscope::emu::syncthreads_reduce(p, 1); }
inline int __syncthreads_or(int p) { return kvscope::emu::syncthreads_reduce(p, 2); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- warp operations ------------------------------------------------------------
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  using kvscope::emu::WarpOp;
  return kvscope::emu::shfl(WarpOp::kShflIdx, mask, var, src_lane,
                           kvscope::emu::shfl_clamp(width, false));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using kvscope::emu::WarpOp;
  return kvscope::emu::shfl(WarpOp::kShflUp, mask, var, static_cast<int>(delta),
                           kvscope::emu::shfl_clamp(width, true));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using kvscope::emu::WarpOp;
  return kvscope::emu::shfl(WarpOp::kShflDown, mask, var, static_cast<int>(delta),
                           kvscope::emu::shfl_clamp(width, false));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  using kvscope::emu::WarpOp;
  return kvscope::emu::shfl(WarpOp::kShflXor, mask, var, lane_mask,
                           kvscope::emu::shfl_clamp(width, false));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(
      kvscope::emu::warp_exchange(kvscope::emu::WarpOp::kBallot, mask, pred != 0, 0, 0));
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  kvscope::emu::warp_exchange(kvscope::emu::WarpOp::kSync, mask, 0, 0, 0);
}
inline unsigned __activemask() { return kvscope::emu::active_mask(); }

// ---- atomics (real atomics: blocks run concurrently on the worker pool) ------------
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* p, unsigned v) {
  return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
inline int atomicCAS(int* p, int expected, int desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
  return expected;
}
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
  return expected;
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long expected,
                                    unsigned long long desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
  return expected;
}
namespace kvscope::emu {
template <class T, class U, class F>
T atomic_update(T* p, F f) {
  static_assert(sizeof(T) == sizeof(U));
  U* bits = reinterpret_cast<U*>(p);
  U old = __atomic_load_n(bits, __ATOMIC_SEQ_CST);
  for (;;) {
    T old_v;
    std::memcpy(static_cast<void*>(&old_v), &old, sizeof(T));
    T new_v = f(old_v);
    U new_bits;
    std::memcpy(&new_bits, &new_v, sizeof(T));
    if (__atomic_compare_exchange_n(bits, &old, new_bits, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
      return old_v;
  }
}
}  // namespace kvscope::emu
inline int atomicMax(int* p, int v) {
  return kvscope::emu::atomic_update<int, int>(p, [v](int o) { return o > v ? o : v; });
}
inline unsigned atomicMax(unsigned* p, unsigned v) {
  return kvscope::emu::atomic_update<unsigned, unsigned>(p, [v](unsigned o) { return o > v ? o : v; });
}
inline int atomicMin(int* p, int v) {
  return kvscope::emu::atomic_update<int, int>(p, [v](int o) { return o < v ? o : v; });
}
inline unsigned atomicMin(unsigned* p, unsigned v) {
  return kvscope::emu::atomic_update<unsigned, unsigned>(p, [v](unsigned o) { return o < v ? o : v; });
}
inline float atomicAdd(float* p, float v) {
  return kvscope::emu::atomic_update<float, uint32_t>(p, [v](float o) { return o + v; });
}
inline double atomicAdd(double* p, double v) {
  return kvscope::emu::atomic_update<double, uint64_t>(p, [v](double o) { return o + v; });
}
inline __half atomicAdd(__half* p, __half v) {
  return kvscope::emu::atomic_update<__half, uint16_t>(
      p, [v](__half o) { return __float2half(__half2float(o) + __half2float(v)); });
}
inline float atomicExch(float* p, float v) {
  return kvscope::emu::atomic_update<float, uint32_t>(p, [v](float) { return v; });
}

// ---- math and memory intrinsics (exact on the CPU: tests state tolerances) --------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline void __sincosf(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __uint_as_float(unsigned i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// ---- launching (used only by kernels/launch.cuh) ---------------------------------
namespace kvscope::emu {

struct LaunchSpec {
  const void* func = nullptr;  // kernel address, for per-function attributes
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  // cudaLaunchAttributeProgrammaticStreamSerialization = 1 (programmatic dependent
  // launch): on a GPU the grid may start before the previous kernel has finished, so every
  // thread must call grid_dependency_wait() first; the launch fails when one does not.
  bool programmatic = false;
  // cudaLaunchCooperativeKernel: every block of the grid is resident at once (each on its own
  // OS worker thread), so grid_sync() can hold them all. A grid larger than
  // cooperative_max_blocks(threads per block) fails with cudaErrorCooperativeLaunchTooLarge.
  bool cooperative = false;
};

// The most blocks of `threads_per_block` threads a cooperative launch may have: the emulated
// device is one SM of 2048 resident threads (cudaOccupancyMaxActiveBlocksPerMultiprocessor
// reports 2048 / threads_per_block, multiProcessorCount is 1).
int cooperative_max_blocks(int threads_per_block);

// Runs body() once per CUDA thread of the grid. pointer_problem is non-empty when an
// argument check already failed; the launch then fails with it. Returns the error
// code the real runtime would report (and records it as the last error).
cudaError_t launch(const LaunchSpec& spec, std::function<void()> body,
                   const std::string& pointer_problem);

// True when [p, p + bytes) lies inside one live cudaMalloc allocation.
bool is_device_range(const void* p, size_t bytes);

// Text of the last failed launch or API call (deadlock report, fault, bad argument).
std::string last_error_detail();

// Counters since the last cudaDeviceReset (for tests that count launches): kernel
// launches the host issued that ran directly (not captured into a graph), and
// cudaGraphLaunch calls.
uint64_t direct_kernel_launches();
uint64_t graph_launches();
// cudaGraphInstantiate calls (a captured graph each; a replay makes none).
uint64_t graphs_instantiated();
// Kernels that ran, directly or as nodes of a replayed graph, and the bytes copied from the
// host to the device and back (cudaMemcpy*, captured copies when their graph replays).
uint64_t kernels_run();
uint64_t bytes_to_device();
uint64_t bytes_to_host();
// cudaMemcpy / cudaMemcpyAsync calls from host memory to the device that ran when the host
// made them (not captured into a graph): on a GPU each costs the host a driver call.
uint64_t host_copies_to_device();
// cudaMalloc calls that succeeded (on a GPU each is a driver call; its cudaFree waits for
// the device).
uint64_t device_allocations();
// Kernels that ran with the programmatic launch attribute (each checked: every thread
// called grid_dependency_wait), and kernels in which every thread called it (with the
// attribute or without).
uint64_t programmatic_kernels_run();
uint64_t kernels_all_waited();
// Cooperative launches that ran (directly or in a replayed graph).
uint64_t cooperative_kernels_run();

// The compute capability cudaGetDeviceProperties reports, major * 10 + minor: 80 unless
// KVSCOPE_EMU_CC says otherwise (e.g. KVSCOPE_EMU_CC=90 for an sm_90 device, where the
// backend uses programmatic dependent launch). Tests may set it; it survives
// cudaDeviceReset.
void set_compute_capability(int cc);
int compute_capability();

// Worker threads for blocks (1 = deterministic). Default from KVSCOPE_EMU_WORKERS or 1.
void set_workers(int n);
int workers();

}  // namespace kvscope::emu
