// cuda_sampling.cpp — the CUDA backend's device sampler and non-waiting downloads (see
// backend.h, kernels/sample.h, engine/device_sampling.h).
//
// sample_candidates (one row) and sample_candidates_rows (several, one grid row of blocks
// each) share run_sampler: the three sampler kernels after the step's other launches (a
// decode graph is flushed first, so they are never part of it; with programmatic
// dependent launch when the backend uses it), then a copy of each row's header and n
// candidates — 32 + 8n bytes — into pinned memory. The logits stay on the device;
// sample_candidates also copies its row to a buffer of the sampler's own, so that
// sampled_row() can still read it after later forwards reused the scratch slot.
// download_async copies into pinned staging memory with cudaMemcpyAsync; download_wait
// synchronises the stream and moves each staged copy to its destination.
#include <algorithm>
#include <cstring>

#include "engine/cuda/cuda_backend_impl.h"
#include "kernels/sample.h"

namespace kvscope {

Status CudaBackend::PinnedBuffer::ensure(size_t need, const char* what) {
  if (need <= bytes && p) return Status::Ok();
  if (p) cudaFreeHost(p);
  p = nullptr;
  bytes = 0;
  KV_TRY(cuda_check(cudaMallocHost(&p, need), what));
  bytes = need;
  return Status::Ok();
}

namespace {

// One row's results as sample_candidates_rows / sample_candidates leave them (sample.h).
void read_candidates(const char* p, int n, DeviceCandidates& out) {
  kvscope::cuda::SampleHeader h;
  std::memcpy(&h, p, sizeof h);
  const auto* ids = reinterpret_cast<const int32_t*>(p + sizeof h);
  const auto* logits = reinterpret_cast<const float*>(ids + n);
  out.sum = h.sum;
  out.sum_err = h.sum_err;
  out.max = h.max;
  out.nan = h.nan;
  out.ids.assign(ids, ids + h.n);
  out.logits.assign(logits, logits + h.n);
}

}  // namespace

Status CudaBackend::run_sampler(const char* what, Tensor rows, int n, float temperature,
                                float* row_copy, DeviceCandidates* out) {
  namespace kc = kvscope::cuda;
  const int64_t V = rows.cols, R = rows.rows;
  if (R < 1 || R > 65535 || V <= 0 || V > int64_t(1) << 30 || !rows.data)
    return make_error(what, ": rows is ", R, " x ", V,
                      ", expected 1 .. 65535 rows of at least one logit");
  if (n < 1 || n > kc::kSampleMaxCandidates)
    return make_error(what, ": n is ", n, ", expected 1 .. ", kc::kSampleMaxCandidates);
  if (!(temperature > 0))
    return make_error(what, ": temperature is ", temperature, ", expected > 0");
  KV_TRY(graph_.flush());
  const int Vi = int(V), Ri = int(R);
  const size_t out_bytes = kc::sample_out_bytes(n);
  KV_TRY(
      sampling_.work.ensure(kc::sample_row_work_bytes(Vi, n) * size_t(R), "sampler work memory"));
  KV_TRY(sampling_.out.ensure(out_bytes * size_t(R), "sampler results"));
  KV_TRY(sampling_.result.ensure(out_bytes * size_t(R), "sampler results (host)"));
  // Programmatic dependent launch like the step's other kernels (op_launcher.h): the
  // sampler's kernels wait for the LM head's logits in their first statement.
  kc::ProgrammaticLaunchScope pdl(pdl_);
  KV_TRY(cuda_check(kc::sample_candidates_rows(rows.data, Ri, Vi, n, temperature, row_copy,
                                               sampling_.work.p, sampling_.out.p, stream_),
                    "sampling on the device"));
  KV_TRY(cuda_check(cudaMemcpyAsync(sampling_.result.p, sampling_.out.p, out_bytes * size_t(R),
                                    cudaMemcpyDeviceToHost, stream_),
                    "copying the sampled candidates to the host"));
  KV_TRY(cuda_check(cudaStreamSynchronize(stream_), "waiting for the GPU"));
  for (int r = 0; r < Ri; ++r)
    read_candidates(static_cast<const char*>(sampling_.result.p) + size_t(r) * out_bytes, n,
                    out[r]);
  return Status::Ok();
}

Status CudaBackend::sample_candidates(Tensor logits_row, int n, float temperature,
                                      DeviceCandidates& out) {
  const int64_t V = logits_row.cols;
  if (logits_row.rows != 1 || V <= 0 || V > int64_t(1) << 30 || !logits_row.data)
    return make_error("sample_candidates: logits_row is ", logits_row.rows, " x ", V,
                      ", expected one row of at least one logit");
  KV_TRY(sampling_.row.ensure(size_t(V) * sizeof(float), "the sampled logits row"));
  sampling_.row_cols = 0;
  KV_TRY(run_sampler("sample_candidates", logits_row, n, temperature,
                     static_cast<float*>(sampling_.row.p), &out));
  sampling_.row_cols = V;
  return Status::Ok();
}

Status CudaBackend::sample_candidates_rows(Tensor rows, int n, float temperature,
                                           std::vector<DeviceCandidates>& out) {
  out.resize(size_t(std::max<int64_t>(rows.rows, 0)));
  return run_sampler("sample_candidates_rows", rows, n, temperature, nullptr, out.data());
}

Status CudaBackend::sampled_row(float* host) {
  if (sampling_.row_cols <= 0 || !host)
    return make_error("sampled_row: no logits row has been sampled on the device");
  KV_TRY(graph_.flush());
  KV_TRY(cuda_check(cudaMemcpyAsync(host, sampling_.row.p, size_t(sampling_.row_cols) * 4,
                                    cudaMemcpyDeviceToHost, stream_),
                    "copying the sampled logits row to the host"));
  return cuda_check(cudaStreamSynchronize(stream_), "waiting for the GPU");
}

Status CudaBackend::download_async(Tensor src, float* host) {
  if (src.size() == 0) return Status::Ok();
  if (!src.data || !host) return make_error("download_async: a null source or destination");
  KV_TRY(graph_.flush());
  const size_t n = size_t(src.size());
  if ((sampling_.staged + n) * sizeof(float) > sampling_.stage.bytes) {
    KV_TRY(download_wait());  // the staged copies land before the buffer moves
    KV_TRY(sampling_.stage.ensure(std::max(n * sizeof(float), sampling_.stage.bytes * 2),
                                  "pinned staging memory"));
  }
  float* at = static_cast<float*>(sampling_.stage.p) + sampling_.staged;
  KV_TRY(
      cuda_check(cudaMemcpyAsync(at, src.data, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                 "copying results to the host"));
  sampling_.pending.emplace_back(host, n);
  sampling_.staged += n;
  return Status::Ok();
}

Status CudaBackend::download_wait() {
  if (sampling_.pending.empty()) return Status::Ok();
  const Status s = cuda_check(cudaStreamSynchronize(stream_), "waiting for the GPU");
  const float* at = static_cast<const float*>(sampling_.stage.p);
  for (const auto& [host, n] : sampling_.pending) {
    if (s.ok()) std::memcpy(host, at, n * sizeof(float));
    at += n;
  }
  sampling_.pending.clear();
  sampling_.staged = 0;
  return s;
}

}  // namespace kvscope
