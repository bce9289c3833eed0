// cuda_weights.h — the model's weights on the device, for the CUDA backend.
//
// Each host Weight (keyed by its mapped data pointer) is uploaded once in its stored
// form (quantized blocks as they are; vectors — norm scales, biases — as fp32). Matrices
// that a kernel cannot read natively, or that go through cuBLAS (prefill), also get an
// fp32 copy dequantized on the device the first time they are needed: activations then
// stay fp32 through every product (no fp16 rounding of weights or activations).
#pragma once

#include <cuda_runtime.h>

#include <unordered_map>

#include "engine/cuda/cuda_util.h"
#include "engine/model.h"
#include "kernels/kernels.h"

namespace kvscope {

struct DeviceWeight {
  DeviceBuffer raw;         // stored form (fp32 for vectors)
  DeviceBuffer f32;         // [n_out][n_in] dequantized, when made
  kvscope::cuda::QMatrix q;  // view of raw
  const float* vec() const { return static_cast<const float*>(raw.p); }
  const float* mat_f32() const { return static_cast<const float*>(f32.p); }
};

class WeightStore {
 public:
  explicit WeightStore(cudaStream_t stream) : stream_(stream) {}
  // The device copy of `w`, uploaded on first use.
  Expected<DeviceWeight*> get(const Weight& w);
  // Makes d's fp32 copy (a one-time conversion issued on the stream).
  Status ensure_f32(DeviceWeight& d);
  void clear() { weights_.clear(); }

 private:
  cudaStream_t stream_;
  std::unordered_map<const uint8_t*, DeviceWeight> weights_;
};

}  // namespace kvscope
