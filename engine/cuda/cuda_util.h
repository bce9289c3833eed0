// cuda_util.h — the CUDA backend's status conversion and device memory: every CUDA or
// cuBLAS status becomes a kvscope::Error where it is returned, and DeviceBuffer owns one
// cudaMalloc allocation (out of memory says how much was asked and how much is free).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "common/status.h"

namespace kvscope {

// "cudaErrorX (description): emulator detail".
std::string cuda_text(cudaError_t e);
Status cuda_check(cudaError_t e, const char* what);
Status cublas_check(cublasStatus_t s, const char* what);
// cudaMalloc with a clear out-of-memory message naming `what`.
Status device_alloc(void** p, size_t bytes, const char* what);

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) {
    o.p = nullptr;
    o.bytes = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  // Grows to at least `need` bytes (contents not kept).
  Status ensure(size_t need, const char* what);
};

}  // namespace kvscope
