// cuda_backend.cpp — the CUDA backend's setup, scratch memory, KV caches, downloads and
// step timing, and device detection (see cuda_backend.h, cuda_backend_impl.h).
#include "engine/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/cuda/cuda_backend_impl.h"
#include "kernels/kernels.h"

namespace kvscope {

namespace {

// Programmatic dependent launch on the current device (set to info's): see
// CudaBackendOptions::programmatic_launch.
bool use_programmatic_launch(const CudaDeviceInfo& info, const CudaBackendOptions& opt) {
  if (!opt.programmatic_launch || info.cc_major < 9) return false;
  const char* env = std::getenv("KVSCOPE_CUDA_PDL");
  if (env && (std::strcmp(env, "0") == 0 || std::strcmp(env, "off") == 0)) return false;
  // Graph capture keeps programmatic edges from CUDA 12.3 on (runtime and driver).
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess ||
      cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (driver < 12030 || runtime < 12030) return false;
  // Kernels built without compute_90 would run without their wait: a race, not a speedup.
  return kvscope::cuda::grid_dependency_wait_compiled();
}

}  // namespace

CudaBackend::CudaBackend(CudaDeviceInfo info, CudaBackendOptions opt)
    : info_(std::move(info)), opt_(opt) {
  if (const char* env = std::getenv("KVSCOPE_CUDA_GEMM_BLOCKS")) {
    const int n = std::atoi(env);
    if (n >= 1 && n <= 4096) opt_.batched_target_blocks = n;
  }
}

std::string CudaBackend::name() const {
  if (info_.cc_major < 9) return "cuda (" + info_.name + ")";
  return "cuda (" + info_.name + (pdl_ ? ", PDL on)" : ", PDL off)");
}

CudaBackend::~CudaBackend() {
  if (weights_) weights_->clear();
  slots_.clear();
  ids_ = DeviceBuffer();
  if (blas_) cublasDestroy(blas_);
  if (ev_start_) cudaEventDestroy(ev_start_);
  if (ev_stop_) cudaEventDestroy(ev_stop_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaBackend::init(const Model& model) {
  KV_TRY(cuda_check(cudaSetDevice(info_.device), "cudaSetDevice"));
  KV_TRY(
      cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream"));
  KV_TRY(cuda_check(cudaEventCreate(&ev_start_), "creating an event"));
  KV_TRY(cuda_check(cudaEventCreate(&ev_stop_), "creating an event"));
  KV_TRY(cublas_check(cublasCreate(&blas_), "cublasCreate"));
  KV_TRY(cublas_check(cublasSetStream(blas_, stream_), "cublasSetStream"));
  KV_TRY(cuda_check(kvscope::cuda::kernels_init(), "configuring the kernels"));
  pdl_ = use_programmatic_launch(info_, opt_);
  // Room for a batched decode step's staged values: B token ids and the rows ops' cache
  // references of every layer, B <= kMaxStepRows (plus alignment for several runs).
  const int maxb = DecodeGraph::kMaxStepRows;
  KV_TRY(graph_.init(stream_, size_t(maxb) * sizeof(int32_t) +
                                  size_t(model.config().n_layer) * size_t(maxb) *
                                      sizeof(kvscope::cuda::KvRowRef) +
                                  size_t(maxb) * 16));
  n_head_ = model.config().n_head;
  // The fused decode kernels' work memory for this model, before any step is recorded
  // (growing it later flushes the recording); their counters below, with the batched
  // product's.
  const ModelConfig& mc = model.config();
  auto work = ffn_work(kvscope::cuda::norm_ffn_work_floats(mc.n_ff, mc.n_embd));
  if (!work.ok()) return work.error();
  weights_.emplace(stream_);
  ops_.emplace(graph_, stream_, pdl_);
  std::vector<const Weight*> all = {&model.tok_embd(), &model.output_norm(), &model.output()};
  for (const LayerWeights& lw : model.layers())
    for (const Weight* w : {&lw.attn_norm, &lw.wq, &lw.wk, &lw.wv, &lw.bq, &lw.bk, &lw.bv,
                            &lw.q_norm, &lw.k_norm, &lw.wo, &lw.post_attn_norm, &lw.ffn_norm,
                            &lw.w_gate, &lw.w_up, &lw.w_down, &lw.post_ffn_norm})
      if (w->data) all.push_back(w);
  // The batched product's split work memory for the largest batch, likewise before any step
  // is recorded, and the counters: the fused kernels' two, attention's per head, then the
  // batched product's.
  int64_t split_floats = 0;
  int split_counters = 0;
  for (const Weight* w : all) {
    auto d = weights_->get(*w);
    if (!d.ok()) return d.error();
    const kvscope::cuda::QMatrix& q = (*d)->q;
    const int T = opt_.batched_max_tokens, target = opt_.batched_target_blocks;
    split_floats = std::max(split_floats, kvscope::cuda::matmul_batched_work_floats(q, T, target));
    split_counters = std::max(split_counters, kvscope::cuda::matmul_batched_counters(q, T, target));
  }
  if (split_floats > 0) {
    auto split_work = work_buffer(batched_work_, split_floats, "batched product work memory");
    if (!split_work.ok()) return split_work.error();
  }
  auto sync = sync_counters(2 + n_head_ + split_counters);
  if (!sync.ok()) return sync.error();
  return cuda_check(cudaStreamSynchronize(stream_), "uploading the weights");
}

Expected<Tensor> CudaBackend::do_scratch(int slot, int64_t rows, int64_t cols) {
  if (size_t(slot) >= slots_.size()) slots_.resize(size_t(slot) + 1);
  DeviceBuffer& b = slots_[size_t(slot)];
  const size_t need = size_t(rows * cols) * sizeof(float);
  if (need > b.bytes || !b.p) {
    KV_TRY(graph_.flush());  // recorded launches may point into the old buffer
    // Grow by at least half again: the attention row slot grows by a little every
    // decode step, and a moving buffer would change the decode graph's key each time.
    KV_TRY(b.ensure(b.p ? std::max(need, b.bytes + b.bytes / 2) : need, "activations"));
  }
  return Tensor{static_cast<float*>(slots_[size_t(slot)].p), rows, cols};
}

Expected<std::unique_ptr<KvCache>> CudaBackend::do_create_kv_cache(const KvCacheConfig& config,
                                                                   int capacity) {
  KV_TRY(graph_.flush());
  auto made = CudaKvCache::create(config, capacity, stream_);
  if (!made.ok()) return made;
  // The split decode attention's work memory for this many slots, now rather than during
  // the first decode step (growing it then would keep that step out of a CUDA graph).
  kvscope::cuda::KvLayer kl;
  kl.n_head_kv = config.shape.n_head_kv;
  kl.head_dim = config.shape.head_dim;
  kl.n_slots = std::max(capacity, 1);
  const size_t need = size_t(kvscope::cuda::attention_decode_work_floats(n_head_, kl)) * 4;
  if (need > attn_work_.bytes) KV_TRY(attn_work_.ensure(need, "attention work memory"));
  return made;
}

Expected<std::shared_ptr<KvPool>> CudaBackend::create_kv_pool(const KvPoolConfig& config) {
  KV_TRY(graph_.flush());
  return CudaKvPool::create(config, stream_);
}

Expected<std::unique_ptr<KvCache>> CudaBackend::create_paged_kv_cache(const KvCacheConfig& config,
                                                                      std::shared_ptr<KvPool> pool) {
  if (!dynamic_cast<const CudaKvPool*>(pool.get()))
    return make_error("cuda: a paged cache needs a pool made by the cuda backend");
  KV_TRY(graph_.flush());
  return CudaKvCache::create_paged(config, std::move(pool), stream_);
}

Status CudaBackend::do_download(Tensor src, float* host) {
  KV_TRY(graph_.flush());
  if (src.size() == 0) return Status::Ok();
  KV_TRY(cuda_check(cudaMemcpyAsync(host, src.data, size_t(src.size()) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_),
                    "copying results to the host"));
  return cuda_check(cudaStreamSynchronize(stream_), "waiting for the GPU");
}

void CudaBackend::begin_step() {
  timing_ok_ = graph_.flush().ok() && cudaEventRecord(ev_start_, stream_) == cudaSuccess;
}

std::optional<double> CudaBackend::end_step() {
  if (!timing_ok_ || !graph_.flush().ok() || cudaEventRecord(ev_stop_, stream_) != cudaSuccess ||
      cudaEventSynchronize(ev_stop_) != cudaSuccess)
    return std::nullopt;
  float ms = 0;
  if (cudaEventElapsedTime(&ms, ev_start_, ev_stop_) != cudaSuccess) return std::nullopt;
  return double(ms);
}

const int* CudaBackend::step_pos(int pos0) {
  return graph_.recording() && graph_.use_pos0(pos0) ? graph_.pos0_dev() : nullptr;
}

float* CudaBackend::slot_base(Tensor t, int64_t* row0) const {
  for (const DeviceBuffer& b : slots_) {
    const auto* base = static_cast<float*>(b.p);
    if (!base || t.data < base || t.data >= base + b.bytes / sizeof(float)) continue;
    const int64_t off = t.data - base;
    if (t.cols <= 0 || off % t.cols != 0) return nullptr;
    *row0 = off / t.cols;
    return const_cast<float*>(base);
  }
  return nullptr;
}

Expected<CudaDeviceInfo> cuda_probe(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const char* why = e == cudaErrorInsufficientDriver
                          ? "no NVIDIA driver (or one too old for this CUDA runtime)"
                      : e == cudaErrorNoDevice ? "no CUDA-capable device"
                                               : "the CUDA runtime could not start";
    return make_error("cuda: no usable GPU: ", why, " (cudaGetDeviceCount: ", cudaGetErrorName(e),
                      "); use the CPU backend");
  }
  if (count <= 0)
    return make_error("cuda: no usable GPU: no CUDA-capable device; use the CPU backend");
  if (device < 0 || device >= count)
    return make_error("cuda: device ", device, " does not exist (", count, " found: 0..", count - 1,
                      ")");
  cudaDeviceProp prop;
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess)
    return make_error("cuda: reading device ", device, " failed: ", cuda_text(e));
  CudaDeviceInfo info;
  info.device = device;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_bytes = prop.totalGlobalMem;
  return info;
}

Expected<std::unique_ptr<Backend>> make_cuda_backend(const Model& model,
                                                     const CudaBackendOptions& options) {
  auto info = cuda_probe(options.device);
  if (!info.ok()) return info.error();
  auto be = std::make_unique<CudaBackend>(std::move(info.value()), options);
  KV_TRY(be->init(model));
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace kvscope
