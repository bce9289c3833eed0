// cuda_util.cpp — see cuda_util.h.
#include "engine/cuda/cuda_util.h"

#include <algorithm>

#include "kernels/kernels.h"

namespace kvscope {

std::string cuda_text(cudaError_t e) {
  std::string s = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
  const std::string d = kvscope::cuda::error_detail();
  if (!d.empty()) s += ": " + d;
  return s;
}

Status cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return make_error("cuda: ", what, " failed: ", cuda_text(e));
}

Status cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_error("cuda: cuBLAS ", what, " failed: ", cublasGetStatusString(s));
}

Status device_alloc(void** p, size_t bytes, const char* what) {
  *p = nullptr;
  cudaError_t e = cudaMalloc(p, std::max<size_t>(bytes, 1));
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // out of memory is not sticky: clear it for the next call
  if (e == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return make_error("cuda: out of GPU memory allocating ", bytes, " bytes for ", what, " (",
                      free_b >> 20, " MiB free of ", total_b >> 20,
                      " MiB); close other GPU programs or use the CPU backend");
  }
  return make_error("cuda: cudaMalloc of ", bytes, " bytes for ", what, " failed: ", cuda_text(e));
}

Status DeviceBuffer::ensure(size_t need, const char* what) {
  if (need <= bytes && p) return Status::Ok();
  if (p) cudaFree(p);
  p = nullptr;
  bytes = 0;
  KV_TRY(device_alloc(&p, need, what));
  bytes = need;
  return Status::Ok();
}

}  // namespace kvscope
