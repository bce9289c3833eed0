// launch.cuh — the single way kernels are launched, in the nvcc and the emulated build.
//
// launch(kernel, grid, block, smem_bytes, stream, args...) returns the launch's
// cudaError_t. Under nvcc it is `kernel<<<grid, block, smem, stream>>>(args...)`
// followed by cudaGetLastError(); under KVSCOPE_CUDA_EMU the emulator validates the
// configuration like a GPU (threads per block, grid limits, shared memory), rejects
// pointer arguments that do not point into a cudaMalloc allocation, and runs the grid.
// Include only from .cu files (the nvcc build parses <<< >>>).
//
// Programmatic dependent launch: while a ProgrammaticLaunchScope(true) is active on the
// calling thread (kernels.h; the CUDA backend opens one around every op on an sm_90+
// device), the kernel goes out through cudaLaunchKernelEx with
// cudaLaunchAttributeProgrammaticStreamSerialization = 1: it may begin while the previous
// kernel in the stream is finishing, and its grid_dependency_wait() (the first statement
// of every kernel, cuda_compat.cuh) holds it until that kernel's writes are visible. Only
// the dependency on a preceding *kernel* is relaxed: a memcpy, memset or event between two
// kernels keeps full stream order, and a kernel without the attribute (cuBLAS, or one
// launched outside a scope) waits for everything before it as usual. Captured into a
// graph (CUDA >= 12.3) the launch becomes a programmatic edge with the same meaning. The
// emulator records the attribute and fails a launch in which a thread did not wait.
//
// launch_cooperative(kernel, grid, block, smem_bytes, stream, args...): a cooperative launch
// (cudaLaunchCooperativeKernel), the only kind in which the kernel may call grid_sync()
// (cuda_compat.cuh). Every block must be resident at once: size the grid with
// cooperative_grid_limit() below; a larger grid fails with
// cudaErrorCooperativeLaunchTooLarge. Never programmatic (no PDL attribute).
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

#include <tuple>
#include <type_traits>
#if defined(KVSCOPE_CUDA_EMU)
#include <cstdio>
#endif

namespace kvscope::cuda {

#if defined(KVSCOPE_CUDA_EMU)
namespace detail {
template <class T>
void check_pointer_arg(const T& v, int index, std::string& problem) {
  if constexpr (std::is_pointer_v<T>) {
    if (v != nullptr && problem.empty() && !::kvscope::emu::is_device_range(v, 0)) {
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "argument %d (%p) is not a device pointer from cudaMalloc", index,
                    static_cast<const void*>(v));
      problem = buf;
    }
  }
}

// A launch on the emulator (plain, programmatic or cooperative): the arguments converted to
// the parameter types once, as the launch would copy them, and each pointer checked.
template <class... Params, class... Args>
cudaError_t emu_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                       cudaStream_t stream, bool programmatic, bool cooperative, Args&&... args) {
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  std::string problem;
  int index = 0;
  std::apply([&](const auto&... p) { (check_pointer_arg(p, index++, problem), ...); }, params);
  ::kvscope::emu::LaunchSpec spec;
  spec.func = reinterpret_cast<const void*>(kernel);
  spec.grid = grid;
  spec.block = block;
  spec.smem = smem_bytes;
  spec.stream = stream;
  spec.programmatic = programmatic;
  spec.cooperative = cooperative;
  return ::kvscope::emu::launch(
      spec, [kernel, params] { std::apply(kernel, params); }, problem);
}
}  // namespace detail
#endif

template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
#if defined(KVSCOPE_CUDA_EMU)
  return detail::emu_launch(kernel, grid, block, smem_bytes, stream, programmatic_launch(), false,
                            std::forward<Args>(args)...);
#else
#if CUDART_VERSION >= 12030
  if (programmatic_launch()) {
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
    const cudaError_t last = cudaGetLastError();  // clears what a failed launch recorded
    return e != cudaSuccess ? e : last;
  }
#endif
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#endif
}

template <class... Params, class... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                               cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
#if defined(KVSCOPE_CUDA_EMU)
  return detail::emu_launch(kernel, grid, block, smem_bytes, stream, false, true,
                            std::forward<Args>(args)...);
#else
  // The arguments converted to the parameter types, and their addresses for the runtime.
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  void* argv[sizeof...(Params) > 0 ? sizeof...(Params) : 1] = {};
  std::apply(
      [&](auto&... p) {
        int i = 0;
        ((argv[i++] = static_cast<void*>(&p)), ...);
      },
      params);
  const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), grid,
                                                    block, argv, smem_bytes, stream);
  const cudaError_t last = cudaGetLastError();  // clears what a failed launch recorded
  return e != cudaSuccess ? e : last;
#endif
}

// The most blocks of `threads` threads with `smem_bytes` of dynamic shared memory that can
// be resident at once on the current device (occupancy per SM times the SM count): the
// largest grid launch_cooperative accepts for `kernel`. 0 when the runtime cannot tell.
template <class... Params>
int cooperative_grid_limit(void (*kernel)(Params...), int threads, size_t smem_bytes) {
  int device = 0, per_sm = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(kernel),
                                                    threads, smem_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return prop.cooperativeLaunch ? per_sm * prop.multiProcessorCount : 0;
}

}  // namespace kvscope::cuda
