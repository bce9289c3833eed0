// cuda_backend.cpp — Backend ops on an NVIDIA GPU (see cuda_backend.h).
//
// Ownership: the backend owns one stream, one cuBLAS handle, two timing events, device
// copies of the model's weights (keyed by the host Weight::data pointer; uploaded once,
// fp16 copies made on the GPU the first time a weight needs them) and the scratch slots.
// Work is issued asynchronously on the stream; download() synchronises. Every CUDA or
// cuBLAS status is checked where it is returned and turned into a kvscope::Error.
//
// Per decode step (T = 1) the forward issues 9 kernel launches per layer through the
// fused ops (q/k/v matvec, rope + kv write, kv norms, attention, Wo matvec,
// add + rmsnorm, gate/up/silu matvec, down matvec, add + rmsnorm) plus embed, the first
// rmsnorm and the LM head: 9 L + 3 (273 for 30 layers; unfused it was 17 L + 3).
#include "engine/cuda/cuda_backend.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "engine/cuda/decode_graph.h"
#include "engine/quant.h"
#include "kernels/kernels.h"

namespace kvscope {
namespace {

using kvscope_cuda::QMatrix;
using kvscope_cuda::QType;

std::string cuda_text(cudaError_t e) {
  std::string s = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
  const std::string d = kvscope_cuda::error_detail();
  if (!d.empty()) s += ": " + d;
  return s;
}

Status check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return make_error("cuda: ", what, " failed: ", cuda_text(e));
}

Status check_blas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return make_error("cuda: cuBLAS ", what, " failed: ", cublasGetStatusString(s));
}

// cudaMalloc with an out-of-memory message that says how much was asked and is free.
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

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  // Grows to at least `need` bytes (contents not kept).
  Status ensure(size_t need, const char* what) {
    if (need <= bytes && p) return Status::Ok();
    if (p) cudaFree(p);
    p = nullptr;
    bytes = 0;
    KV_TRY(device_alloc(&p, need, what));
    bytes = need;
    return Status::Ok();
  }
};

// Per layer K and V, each [Hkv][n_slots][D] of the K / V type, and the slot -> position
// map [n_slots] int32 (a device copy of the engine's map: the K/V store kernels write the
// entries of the positions they store; relayout() uploads the whole map).
class CudaKvCache final : public KvCache {
 public:
  CudaKvCache(const KvCacheConfig& config, cudaStream_t stream)
      : KvCache(config), stream_(stream), k_(size_t(config.shape.n_layer)),
        v_(size_t(config.shape.n_layer)), pos_(size_t(config.shape.n_layer)),
        slots_(size_t(config.shape.n_layer), 0) {}

  static Expected<std::unique_ptr<KvCache>> create(const KvCacheConfig& config, int capacity,
                                                   cudaStream_t stream) {
    for (KvDtype t : {config.types.k, config.types.v})
      if (t != KvDtype::F16 && t != KvDtype::F32)
        return make_error("cuda: KV cache type ", kv_dtype_name(t), " is not supported (f16, f32)");
    auto cache = std::make_unique<CudaKvCache>(config, stream);
    KV_TRY(cache->init_storage(capacity));
    return std::unique_ptr<KvCache>(std::move(cache));
  }

  kvscope_cuda::KvLayer layer(int l) const {
    const KvShape& s = shape();
    kvscope_cuda::KvLayer kl;
    kl.k = k_[size_t(l)].p;
    kl.v = v_[size_t(l)].p;
    kl.k_type = kvscope_cuda::KvElem(int(types().k));
    kl.v_type = kvscope_cuda::KvElem(int(types().v));
    kl.n_head_kv = s.n_head_kv;
    kl.head_dim = s.head_dim;
    kl.n_slots = slots_[size_t(l)];
    kl.sink = rule(l).sink;
    kl.window = rule(l).window;
    kl.pos = static_cast<int32_t*>(pos_[size_t(l)].p);
    return kl;
  }

 protected:
  Status relayout(int layer, int n_slots, const std::vector<int32_t>& from) override {
    const KvShape& s = shape();
    const auto moves = kv_moves(from);
    const size_t old_slots = size_t(slots_[size_t(layer)]);
    for (auto [side, type] : {std::pair{&k_, types().k}, std::pair{&v_, types().v}}) {
      const size_t rb = kv_row_bytes(type, s.head_dim);
      DeviceBuffer fresh;
      KV_TRY(fresh.ensure(size_t(s.n_head_kv) * size_t(n_slots) * rb, "the KV cache"));
      const DeviceBuffer& old = (*side)[size_t(layer)];
      for (int h = 0; h < s.n_head_kv; ++h)
        for (const KvMove& m : moves)
          KV_TRY(check(cudaMemcpyAsync(static_cast<uint8_t*>(fresh.p) + (size_t(h) * n_slots + size_t(m.dst)) * rb,
                                       static_cast<const uint8_t*>(old.p) + (size_t(h) * old_slots + size_t(m.src)) * rb,
                                       size_t(m.n) * rb, cudaMemcpyDeviceToDevice, stream_),
                       "moving KV cache rows"));
      // The old buffer is freed only after the copies: cudaFree waits for them.
      (*side)[size_t(layer)] = std::move(fresh);
    }
    DeviceBuffer map;
    KV_TRY(map.ensure(size_t(n_slots) * sizeof(int32_t), "the KV cache slot map"));
    // Pageable source: the call returns once the bytes are staged.
    KV_TRY(check(cudaMemcpyAsync(map.p, slot_pos(layer).data(), size_t(n_slots) * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream_),
                 "uploading the KV cache slot map"));
    pos_[size_t(layer)] = std::move(map);
    slots_[size_t(layer)] = n_slots;
    return Status::Ok();
  }

 private:
  cudaStream_t stream_;
  std::vector<DeviceBuffer> k_, v_;  // per layer [Hkv][n_slots][D]
  std::vector<DeviceBuffer> pos_;    // per layer [n_slots] int32
  std::vector<int> slots_;
};

// A weight on the device: the raw quantized bytes, an fp16 copy made on first need, and
// for vectors (norm scales) an fp32 copy.
struct DeviceWeight {
  DeviceBuffer raw;
  DeviceBuffer f16;  // [n_out][n_in] __half, when made
  QMatrix q;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(CudaDeviceInfo info, CudaBackendOptions opt) : info_(std::move(info)), opt_(opt) {}

  ~CudaBackend() override {
    weights_.clear();
    slots_.clear();
    ids_ = DeviceBuffer();
    x16_ = DeviceBuffer();
    if (blas_) cublasDestroy(blas_);
    if (ev_start_) cudaEventDestroy(ev_start_);
    if (ev_stop_) cudaEventDestroy(ev_stop_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init(const Model& model) {
    KV_TRY(check(cudaSetDevice(info_.device), "cudaSetDevice"));
    KV_TRY(check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream"));
    KV_TRY(check(cudaEventCreate(&ev_start_), "creating an event"));
    KV_TRY(check(cudaEventCreate(&ev_stop_), "creating an event"));
    KV_TRY(check_blas(cublasCreate(&blas_), "cublasCreate"));
    KV_TRY(check_blas(cublasSetStream(blas_, stream_), "cublasSetStream"));
    KV_TRY(check(kvscope_cuda::kernels_init(), "configuring the kernels"));
    KV_TRY(graph_.init(stream_));
    KV_TRY(upload(model.tok_embd()).status);
    KV_TRY(upload(model.output_norm()).status);
    KV_TRY(upload(model.output()).status);
    for (const LayerWeights& lw : model.layers())
      for (const Weight* w : {&lw.attn_norm, &lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.ffn_norm,
                              &lw.w_gate, &lw.w_up, &lw.w_down})
        KV_TRY(upload(*w).status);
    return check(cudaStreamSynchronize(stream_), "uploading the weights");
  }

  std::string name() const override { return "cuda (" + info_.name + ")"; }

  Expected<Tensor> scratch(int slot, int64_t rows, int64_t cols) override {
    if (slot < 0 || slot > 64) return make_error("cuda: scratch slot ", slot, " out of range [0, 64]");
    if (rows < 0 || cols < 0) return make_error("cuda: scratch shape ", rows, " x ", cols, " is negative");
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

  Expected<std::unique_ptr<KvCache>> create_kv_cache(const KvCacheConfig& config,
                                                     int capacity) override {
    KV_TRY(graph_.flush());
    return CudaKvCache::create(config, capacity, stream_);
  }

  Status embed(const Weight& tok_embd, const int32_t* ids, Tensor out) override {
    const int T = int(out.rows);
    if (out.cols != tok_embd.n_in)
      return make_error("cuda: embed output has ", out.cols, " columns, the table ", tok_embd.n_in);
    for (int t = 0; t < T; ++t)
      if (ids[t] < 0 || ids[t] >= tok_embd.n_out)
        return make_error("cuda: token id ", ids[t], " is outside the vocabulary [0, ",
                          tok_embd.n_out, ")");
    auto w = weight(tok_embd);
    if (!w.status.ok()) return w.status;
    KV_TRY(graph_.flush());
    if (T == 1 && opt_.decode_graph) {
      // A decode step starts: record its launches; the token goes in with the step's
      // parameters (DecodeGraph::flush).
      graph_.begin(ids[0]);
      const QMatrix q = w.w->q;
      const int32_t* id_dev = graph_.token_dev();
      float* o = out.data;
      cudaStream_t st = stream_;
      return issue("embed kernel", key(1, q.data, int(q.type), q.row_bytes, q.n_in, o),
                   [=] { return kvscope_cuda::embed(q, id_dev, 1, o, st); });
    }
    KV_TRY(ids_.ensure(size_t(T) * sizeof(int32_t), "token ids"));
    KV_TRY(check(cudaMemcpyAsync(ids_.p, ids, size_t(T) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream_),
                 "copying token ids"));
    // The host ids may change after we return: wait until the copy has read them.
    KV_TRY(check(cudaStreamSynchronize(stream_), "copying token ids"));
    return check(kvscope_cuda::embed(w.w->q, static_cast<const int32_t*>(ids_.p), T, out.data, stream_),
                 "embed kernel");
  }

  Status rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) override {
    if (w.n_in != x.cols || w.n_out != 1 || out.cols != x.cols || out.rows != x.rows)
      return make_error("cuda: rmsnorm shapes: x ", x.rows, "x", x.cols, ", weight ", w.name, " ",
                        w.n_in, "x", w.n_out);
    auto dw = weight(w);
    if (!dw.status.ok()) return dw.status;
    const float* wp = static_cast<const float*>(dw.w->raw.p);
    cudaStream_t st = stream_;
    return issue("rmsnorm kernel", key(2, x.data, wp, x.rows, x.cols, eps, out.data),
                 [=] { return kvscope_cuda::rmsnorm(x.data, wp, int(x.rows), int(x.cols), eps, out.data, st); });
  }

  Status matmul(const Weight& w, Tensor x, Tensor out) override {
    if (x.cols != w.n_in || out.cols != w.n_out || out.rows != x.rows)
      return make_error("cuda: matmul shapes: ", w.name, " is ", w.n_out, "x", w.n_in, ", x ",
                        x.rows, "x", x.cols, ", out ", out.rows, "x", out.cols);
    auto dw = weight(w);
    if (!dw.status.ok()) return dw.status;
    DeviceWeight& d = *dw.w;
    const int T = int(x.rows);
    cudaStream_t st = stream_;
    if (T <= opt_.matvec_max_tokens && kvscope_cuda::matvec_native(d.q.type)) {
      const QMatrix q = d.q;
      return issue("matvec kernel", key(3, q.data, int(q.type), q.row_bytes, q.n_in, q.n_out, x.data, T, out.data),
                   [=] { return kvscope_cuda::matvec_q(q, x.data, T, out.data, st); });
    }
    KV_TRY(ensure_f16(d, w.name));  // a one-time conversion, issued now (before the step)
    const auto* w16 = static_cast<const __half*>(d.f16.p);
    if (T <= opt_.matvec_max_tokens) {
      const int64_t n_in = w.n_in, n_out = w.n_out;
      return issue("fp16 matvec kernel", key(4, w16, n_in, n_out, x.data, T, out.data),
                   [=] { return kvscope_cuda::matvec_f16(w16, n_in, n_out, x.data, T, out.data, st); });
    }
    KV_TRY(graph_.flush());
    // out^T (n_out x T, column-major) = W16^T-as-stored (n_out x n_in) * x^T (n_in x T).
    KV_TRY(x16_.ensure(size_t(x.size()) * sizeof(__half), "fp16 activations"));
    auto* x16 = static_cast<__half*>(x16_.p);
    KV_TRY(check(kvscope_cuda::to_f16(x.data, x.size(), x16, stream_), "fp16 conversion kernel"));
    const float one = 1.0f, zero = 0.0f;
    return check_blas(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.n_out), T, int(w.n_in),
                                   &one, w16, CUDA_R_16F, int(w.n_in), x16, CUDA_R_16F,
                                   int(w.n_in), &zero, out.data, CUDA_R_32F, int(w.n_out),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "GemmEx");
  }

  Status rope(Tensor x, int n_heads, int head_dim, int n_rot, int pos0, float base) override {
    if (int64_t(n_heads) * head_dim != x.cols || n_rot > head_dim || n_rot % 2 != 0)
      return make_error("cuda: rope shapes: ", n_heads, " heads x ", head_dim, " dims vs ", x.cols,
                        " columns, n_rot ", n_rot);
    if (graph_.recording()) graph_.not_graphable();  // pos0 is an argument of this kernel
    cudaStream_t st = stream_;
    return issue("rope kernel", key(5), [=] {
      return kvscope_cuda::rope(x.data, int(x.rows), n_heads, head_dim, n_rot, pos0, base, st);
    });
  }

  Status kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) override {
    auto& c = static_cast<CudaKvCache&>(cache);
    if (layer < 0 || layer >= c.shape().n_layer) return make_error("cuda: kv_write layer ", layer);
    KV_TRY(check_room(c, layer, pos0, int(k.rows), "kv_write"));
    if (graph_.recording()) graph_.not_graphable();  // pos0 is an argument of this kernel
    const kvscope_cuda::KvLayer kl = c.layer(layer);
    cudaStream_t st = stream_;
    return issue("kv append kernel", key(6), [=] {
      return kvscope_cuda::kv_append(kl, k.data, v.data, int(k.rows), pos0, st);
    });
  }

  Status attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head, float scale,
                   Tensor out, Tensor probs_last) override {
    const auto& c = static_cast<const CudaKvCache&>(cache);
    const int n_keys = int(pos0 + q.rows);
    if (c.n_slots(layer) > kvscope_cuda::attention_max_keys())
      return make_error("cuda: attention over ", c.n_slots(layer), " cache slots exceeds this GPU's limit of ",
                        kvscope_cuda::attention_max_keys(), " (shared memory per block)");
    if (c.shape().n_head_kv <= 0 || n_head % c.shape().n_head_kv != 0)
      return make_error("cuda: ", n_head, " query heads do not group over ", c.shape().n_head_kv,
                        " kv heads");
    if (probs_last.data && probs_last.cols < n_keys)
      return make_error("cuda: attention probability row holds ", probs_last.cols, " < ", n_keys);
    const kvscope_cuda::KvLayer kl = c.layer(layer);
    cudaStream_t st = stream_;
    if (graph_.recording()) {
      // Graph form: position from device memory, probability rows located by their row
      // index in a scratch slot (the row stride n_keys changes every step).
      int64_t row0 = 0;
      float* base = probs_last.data ? slot_base(probs_last, &row0) : nullptr;
      const bool ok = q.rows == 1 && probs_last.cols == n_keys &&
                      (probs_last.data == nullptr || base != nullptr) && graph_.use_pos0(pos0);
      if (ok) {
        const int* pos_dev = graph_.pos0_dev();
        return issue("attention kernel",
                     key(7, q.data, kl, n_head, scale, out.data, base, row0),
                     [=] {
                       return kvscope_cuda::attention_dev(q.data, kl, 1, pos_dev, n_head, scale,
                                                          out.data, base, row0, st);
                     });
      }
      graph_.not_graphable();
    }
    return issue("attention kernel", key(8), [=] {
      return kvscope_cuda::attention(q.data, kl, int(q.rows), pos0, n_head, scale, out.data,
                                     probs_last.data, probs_last.cols, st);
    });
  }

  Status silu_mul(Tensor gate, Tensor up, Tensor out) override {
    cudaStream_t st = stream_;
    return issue("silu_mul kernel", key(9, gate.data, up.data, gate.size(), out.data), [=] {
      return kvscope_cuda::silu_mul(gate.data, up.data, gate.size(), out.data, st);
    });
  }

  Status add(Tensor x, Tensor y) override {
    cudaStream_t st = stream_;
    return issue("add kernel", key(10, x.data, y.data, x.size()),
                 [=] { return kvscope_cuda::add(x.data, y.data, x.size(), st); });
  }

  Status kv_row_norms(const KvCache& cache, int layer, int pos0, int T, Tensor k_norm,
                      Tensor v_norm) override {
    const auto& c = static_cast<const CudaKvCache&>(cache);
    const kvscope_cuda::KvLayer kl = c.layer(layer);
    cudaStream_t st = stream_;
    const int* pos_dev = nullptr;
    if (graph_.recording() && graph_.use_pos0(pos0)) pos_dev = graph_.pos0_dev();
    return issue("kv norms kernel", key(11, kl, T, k_norm.data, v_norm.data),
                 [=] { return kvscope_cuda::kv_norms(kl, pos0, T, k_norm.data, v_norm.data, st, pos_dev); });
  }

  // --- Fused ops (decode: 9 launches per layer instead of 17). Each checks shapes like
  // the ops it replaces and falls back to the default composition where no fused kernel
  // applies (long matmuls on cuBLAS, weights without a native matvec).

  Status matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x, Tensor q,
                    Tensor k, Tensor v) override {
    const Weight* ws[3] = {&wq, &wk, &wv};
    const Tensor* outs[3] = {&q, &k, &v};
    for (int m = 0; m < 3; ++m)
      if (x.cols != ws[m]->n_in || outs[m]->cols != ws[m]->n_out || outs[m]->rows != x.rows)
        return make_error("cuda: matmul shapes: ", ws[m]->name, " is ", ws[m]->n_out, "x",
                          ws[m]->n_in, ", x ", x.rows, "x", x.cols, ", out ", outs[m]->rows, "x",
                          outs[m]->cols);
    if (x.rows > opt_.matvec_max_tokens) return Backend::matmul_qkv(wq, wk, wv, x, q, k, v);
    DeviceWeight* d[3];
    for (int m = 0; m < 3; ++m) {
      auto dw = weight(*ws[m]);
      if (!dw.status.ok()) return dw.status;
      if (!kvscope_cuda::matvec_native(dw.w->q.type)) return Backend::matmul_qkv(wq, wk, wv, x, q, k, v);
      d[m] = dw.w;
    }
    const QMatrix a = d[0]->q, b = d[1]->q, cq = d[2]->q;
    cudaStream_t st = stream_;
    const int T = int(x.rows);
    return issue("fused q/k/v matvec kernel",
                 key(12, a.data, b.data, cq.data, int(a.type), int(b.type), int(cq.type), a.n_in,
                     a.n_out, b.n_out, cq.n_out, a.row_bytes, b.row_bytes, cq.row_bytes, x.data, T,
                     q.data, k.data, v.data),
                 [=] { return kvscope_cuda::matvec_qkv(a, b, cq, x.data, T, q.data, k.data, v.data, st); });
  }

  Status matmul_gate_up_silu(const Weight& w_gate, const Weight& w_up, Tensor x, Tensor out,
                             Tensor up) override {
    for (const Weight* w : {&w_gate, &w_up})
      if (x.cols != w->n_in || out.cols != w->n_out || out.rows != x.rows)
        return make_error("cuda: matmul shapes: ", w->name, " is ", w->n_out, "x", w->n_in, ", x ",
                          x.rows, "x", x.cols, ", out ", out.rows, "x", out.cols);
    if (x.rows > opt_.matvec_max_tokens) return Backend::matmul_gate_up_silu(w_gate, w_up, x, out, up);
    auto g = weight(w_gate);
    if (!g.status.ok()) return g.status;
    auto u = weight(w_up);
    if (!u.status.ok()) return u.status;
    if (!kvscope_cuda::matvec_native(g.w->q.type) || !kvscope_cuda::matvec_native(u.w->q.type))
      return Backend::matmul_gate_up_silu(w_gate, w_up, x, out, up);
    const QMatrix a = g.w->q, b = u.w->q;
    cudaStream_t st = stream_;
    const int T = int(x.rows);
    return issue("fused gate/up/silu matvec kernel",
                 key(13, a.data, b.data, int(a.type), int(b.type), a.n_in, a.n_out, a.row_bytes,
                     b.row_bytes, x.data, T, out.data),
                 [=] { return kvscope_cuda::matvec_gate_up_silu(a, b, x.data, T, out.data, st); });
  }

  Status rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer, int n_head,
                       int n_rot, int pos0, float base) override {
    auto& c = static_cast<CudaKvCache&>(cache);
    const KvShape& sh = c.shape();
    const int D = sh.head_dim;
    if (int64_t(n_head) * D != q.cols || int64_t(sh.n_head_kv) * D != k.cols || v.cols != k.cols ||
        k.rows != q.rows || v.rows != q.rows || n_rot > D || n_rot < 0 || n_rot % 2 != 0)
      return make_error("cuda: rope_kv_write shapes: q ", q.rows, "x", q.cols, ", k ", k.rows, "x",
                        k.cols, ", v ", v.rows, "x", v.cols, " for ", n_head, "/", sh.n_head_kv,
                        " heads of ", D, " dims, n_rot ", n_rot);
    if (layer < 0 || layer >= sh.n_layer)
      return make_error("cuda: rope_kv_write layer ", layer, " outside [0, ", sh.n_layer, ")");
    KV_TRY(check_room(c, layer, pos0, int(q.rows), "rope_kv_write"));
    const kvscope_cuda::KvLayer kl = c.layer(layer);
    cudaStream_t st = stream_;
    const int* pos_dev = nullptr;
    if (graph_.recording() && graph_.use_pos0(pos0)) pos_dev = graph_.pos0_dev();
    const int T = int(q.rows);
    return issue("fused rope/kv write kernel",
                 key(14, q.data, k.data, v.data, T, n_head, n_rot, base, kl),
                 [=] {
                   return kvscope_cuda::rope_kv_write(q.data, k.data, v.data, T, n_head, n_rot, base,
                                                      kl, pos0, pos_dev, st);
                 });
  }

  Status add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out) override {
    if (y.rows != x.rows || y.cols != x.cols || w.n_in != x.cols || w.n_out != 1 ||
        out.cols != x.cols || out.rows != x.rows)
      return make_error("cuda: add_rmsnorm shapes: x ", x.rows, "x", x.cols, ", y ", y.rows, "x",
                        y.cols, ", weight ", w.name, " ", w.n_in, "x", w.n_out);
    if (out.data == x.data || out.data == y.data) return Backend::add_rmsnorm(x, y, w, eps, out);
    auto dw = weight(w);
    if (!dw.status.ok()) return dw.status;
    const float* wp = static_cast<const float*>(dw.w->raw.p);
    cudaStream_t st = stream_;
    return issue("fused add/rmsnorm kernel", key(15, x.data, y.data, wp, x.rows, x.cols, eps, out.data),
                 [=] {
                   return kvscope_cuda::add_rmsnorm(x.data, y.data, wp, int(x.rows), int(x.cols), eps,
                                                    out.data, st);
                 });
  }

  Status download(Tensor src, float* host) override {
    KV_TRY(graph_.flush());
    KV_TRY(check(cudaMemcpyAsync(host, src.data, size_t(src.size()) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_),
                 "copying results to the host"));
    return check(cudaStreamSynchronize(stream_), "waiting for the GPU");
  }

  void begin_step() override {
    timing_ok_ = graph_.flush().ok() && cudaEventRecord(ev_start_, stream_) == cudaSuccess;
  }

  std::optional<double> end_step() override {
    if (!timing_ok_ || !graph_.flush().ok() || cudaEventRecord(ev_stop_, stream_) != cudaSuccess ||
        cudaEventSynchronize(ev_stop_) != cudaSuccess)
      return std::nullopt;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, ev_start_, ev_stop_) != cudaSuccess) return std::nullopt;
    return double(ms);
  }

 private:
  struct Lookup {
    DeviceWeight* w = nullptr;
    Status status;
  };

  // Device copy of a host weight, uploading it on first use.
  Lookup weight(const Weight& w) {
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return {&it->second, Status::Ok()};
    return upload(w);
  }

  Lookup upload(const Weight& w) {
    auto it = weights_.find(w.data);
    if (it != weights_.end()) return {&it->second, Status::Ok()};
    if (!kvscope_cuda::qtype_supported(int(w.type)))
      return {nullptr, make_error("cuda: weight ", w.name, " has type ", ggml_type_name(w.type),
                                  ", which the CUDA kernels do not decode")};
    DeviceWeight d;
    const bool vector = w.n_out == 1;
    if (vector && w.type != GgmlType::F32) {
      // Norm scales are read as fp32 by the kernels: convert once on the host.
      std::vector<float> f(size_t(w.n_in));
      dequantize_row(w.type, w.data, f.data(), w.n_in);
      Status s = d.raw.ensure(f.size() * sizeof(float), "weights");
      if (!s.ok()) return {nullptr, s};
      s = check(cudaMemcpy(d.raw.p, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice),
                "uploading a weight");
      if (!s.ok()) return {nullptr, s};
      d.q = QMatrix{d.raw.p, QType::F32, w.n_in, 1, w.n_in * 4};
    } else {
      const size_t bytes = size_t(w.row_bytes) * size_t(w.n_out);
      Status s = d.raw.ensure(bytes, "weights");
      if (!s.ok()) return {nullptr, s};
      s = check(cudaMemcpyAsync(d.raw.p, w.data, bytes, cudaMemcpyHostToDevice, stream_),
                "uploading a weight");
      if (!s.ok()) return {nullptr, s};
      d.q = QMatrix{d.raw.p, QType(int(w.type)), w.n_in, w.n_out, int64_t(w.row_bytes)};
    }
    auto [pos, inserted] = weights_.emplace(w.data, std::move(d));
    return {&pos->second, Status::Ok()};
  }

  // Runs a launch now, or appends it to the decode step being recorded.
  Status issue(const char* what, std::vector<int64_t> k, DecodeGraph::Launch l) {
    if (graph_.recording()) {
      graph_.add(std::move(k), std::move(l));
      return Status::Ok();
    }
    return check(l(), what);
  }

  // Key words for a recorded launch: every argument that identifies it, as integers.
  static int64_t word(const void* p) { return int64_t(reinterpret_cast<uintptr_t>(p)); }
  static int64_t word(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return int64_t(b);
  }
  template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
  static int64_t word(I i) {
    return int64_t(i);
  }
  // A cache layer identifies its launch by every field (buffers, types, layout, rule).
  static void put(std::vector<int64_t>& k, const kvscope_cuda::KvLayer& kl) {
    for (int64_t w : {word(kl.k), word(kl.v), int64_t(kl.k_type), int64_t(kl.v_type),
                      int64_t(kl.n_head_kv), int64_t(kl.head_dim), int64_t(kl.n_slots),
                      int64_t(kl.sink), int64_t(kl.window), word(kl.pos)})
      k.push_back(w);
  }
  template <class A>
  static void put(std::vector<int64_t>& k, const A& a) {
    k.push_back(word(a));
  }
  template <class... A>
  static std::vector<int64_t> key(int op, const A&... a) {
    std::vector<int64_t> k{int64_t(op)};
    (put(k, a), ...);
    return k;
  }

  // Positions pos0 .. pos0+T-1 must have been given slots by the cache's begin().
  static Status check_room(const CudaKvCache& c, int layer, int pos0, int T, const char* op) {
    for (int p = pos0; p < pos0 + T; ++p) {
      const int s = c.slot_of(layer, p);
      if (s < 0 || s >= c.n_slots(layer) || c.slot_pos(layer)[size_t(s)] != p)
        return make_error("cuda: ", op, " of position ", p, " in layer ", layer,
                          " which the cache did not make room for");
    }
    return Status::Ok();
  }

  // The scratch slot holding t's data, and t's row index in it (rows of t.cols floats);
  // nullptr when t is not inside a slot at a whole row.
  float* slot_base(Tensor t, int64_t* row0) const {
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

  Status ensure_f16(DeviceWeight& d, const std::string& name) {
    if (d.f16.p) return Status::Ok();
    KV_TRY(d.f16.ensure(size_t(d.q.n_in * d.q.n_out) * sizeof(__half), "fp16 weights"));
    return check(kvscope_cuda::dequantize_f16(d.q, static_cast<__half*>(d.f16.p), stream_),
                 "dequantize kernel");
  }

  CudaDeviceInfo info_;
  CudaBackendOptions opt_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaEvent_t ev_start_ = nullptr, ev_stop_ = nullptr;
  bool timing_ok_ = false;
  std::unordered_map<const uint8_t*, DeviceWeight> weights_;
  std::vector<DeviceBuffer> slots_;
  DeviceBuffer ids_;  // [T] int32 token ids
  DeviceBuffer x16_;  // [T][n_in] fp16 activations for cuBLAS
  DecodeGraph graph_;  // the decode step's launches, replayed as a CUDA graph
};

}  // namespace

Expected<CudaDeviceInfo> cuda_probe(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    const char* why = e == cudaErrorInsufficientDriver ? "no NVIDIA driver (or one too old for this CUDA runtime)"
                      : e == cudaErrorNoDevice        ? "no CUDA-capable device"
                                                      : "the CUDA runtime could not start";
    return make_error("cuda: no usable GPU: ", why, " (cudaGetDeviceCount: ", cudaGetErrorName(e),
                      "); use the CPU backend");
  }
  if (count <= 0) return make_error("cuda: no usable GPU: no CUDA-capable device; use the CPU backend");
  if (device < 0 || device >= count)
    return make_error("cuda: device ", device, " does not exist (", count, " found: 0..", count - 1, ")");
  cudaDeviceProp prop;
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return make_error("cuda: reading device ", device, " failed: ", cuda_text(e));
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
