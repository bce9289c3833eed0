// launch.cuh — the single way kernels are launched, in the nvcc and the emulated build.
//
// launch(kernel, grid, block, smem_bytes, stream, args...) returns the launch's
// cudaError_t. Under nvcc it is `kernel<<<grid, block, smem, stream>>>(args...)`
// followed by cudaGetLastError(); under KVSCOPE_CUDA_EMU the emulator validates the
// configuration like a GPU (threads per block, grid limits, shared memory), rejects
// pointer arguments that do not point into a cudaMalloc allocation, and runs the grid.
// Include only from .cu files (the nvcc build parses <<< >>>).
#pragma once

#include "kernels/cuda_compat.cuh"
#include "kernels/kernels.h"

#if defined(KVSCOPE_CUDA_EMU)
#include <cstdio>
#include <tuple>
#include <type_traits>
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
}  // namespace detail
#endif

template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel argument count mismatch");
#if defined(KVSCOPE_CUDA_EMU)
  // Arguments are converted to the parameter types once, as the launch would copy them.
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  std::string problem;
  int index = 0;
  std::apply([&](const auto&... p) { (detail::check_pointer_arg(p, index++, problem), ...); },
             params);
  ::kvscope::emu::LaunchSpec spec;
  spec.func = reinterpret_cast<const void*>(kernel);
  spec.grid = grid;
  spec.block = block;
  spec.smem = smem_bytes;
  spec.stream = stream;
  return ::kvscope::emu::launch(
      spec, [kernel, params] { std::apply(kernel, params); }, problem);
#else
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#endif
}

}  // namespace kvscope::cuda
