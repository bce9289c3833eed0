// cuda_weights.cpp — see cuda_weights.h.
#include "engine/cuda/cuda_weights.h"

#include <vector>

#include "engine/quant.h"

namespace kvscope {

using kvscope::cuda::QMatrix;
using kvscope::cuda::QType;

Expected<DeviceWeight*> WeightStore::get(const Weight& w) {
  auto it = weights_.find(w.data);
  if (it != weights_.end()) return &it->second;
  if (!kvscope::cuda::qtype_supported(int(w.type)))
    return make_error("cuda: weight ", w.name, " has type ", ggml_type_name(w.type),
                      ", which the CUDA kernels do not decode");
  DeviceWeight d;
  if (w.n_out == 1 && w.type != GgmlType::F32) {
    // Vectors are read as fp32 by the kernels: convert once on the host.
    std::vector<float> f(size_t(w.n_in));
    dequantize_row(w.type, w.data, f.data(), w.n_in);
    KV_TRY(d.raw.ensure(f.size() * sizeof(float), "weights"));
    KV_TRY(
        cuda_check(cudaMemcpy(d.raw.p, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice),
                   "uploading a weight"));
    d.q = QMatrix{d.raw.p, QType::F32, w.n_in, 1, w.n_in * 4};
  } else {
    const size_t bytes = size_t(w.row_bytes) * size_t(w.n_out);
    KV_TRY(d.raw.ensure(bytes, "weights"));
    KV_TRY(cuda_check(cudaMemcpyAsync(d.raw.p, w.data, bytes, cudaMemcpyHostToDevice, stream_),
                      "uploading a weight"));
    d.q = QMatrix{d.raw.p, QType(int(w.type)), w.n_in, w.n_out, int64_t(w.row_bytes)};
  }
  auto [pos, inserted] = weights_.emplace(w.data, std::move(d));
  return &pos->second;
}

Status WeightStore::ensure_f32(DeviceWeight& d) {
  if (d.f32.p) return Status::Ok();
  KV_TRY(d.f32.ensure(size_t(d.q.n_in * d.q.n_out) * sizeof(float), "fp32 weights"));
  return cuda_check(kvscope::cuda::dequantize_f32(d.q, static_cast<float*>(d.f32.p), stream_),
                    "dequantize kernel");
}

}  // namespace kvscope
