// programmatic_launch.cu — the check that the kernels were built with a real grid wait,
// which the backend makes before it launches with programmatic dependent launch.
// Thread mapping: the probe kernel is never launched; only its attributes are read.
#include "kernels/launch.cuh"

namespace kvscope::cuda {
namespace {

__global__ void grid_dependency_probe_kernel() {
  grid_dependency_wait();
  grid_dependents_launch();
}

}  // namespace

bool grid_dependency_wait_compiled() {
#if defined(KVSCOPE_CUDA_EMU)
  (void)grid_dependency_probe_kernel;
  return true;
#else
  // Every kernel comes from the same compile flags: the probe's PTX version (the virtual
  // architecture its running code was made from) is every kernel's.
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, grid_dependency_probe_kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.ptxVersion >= 90;
#endif
}

}  // namespace kvscope::cuda
