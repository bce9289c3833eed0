// cuda_backend_impl.h — the CUDA Backend class, shared by its source files:
//   cuda_backend.cpp  device setup, scratch memory, caches, downloads, step timing
//   cuda_ops.cpp      the ops (shapes checked by Backend; kernels issued via OpLauncher)
//   cuda_fused_ops.cpp the fused layer halves of a decode step (norm_qkv_kv_write, norm_ffn)
//   cuda_rows_ops.cpp the decode-rows ops of a batch over several sequences' paged caches
//   cuda_sampling.cpp the device sampler (kernels/sample.cu) and non-waiting downloads
// Memory lives in cuda_weights.* (model weights), cuda_kv_cache.* (the KV cache) and
// cuda_util.* (buffers, status); decode-step recording in decode_graph.*.
//
// Ownership: the backend owns one stream, one cuBLAS handle, two timing events, the
// device weights, the scratch slots and the decode graph. Work is issued asynchronously
// on the stream; download() synchronises.
//
// Per decode step (T = 1) of one sequence the forward issues 4 kernel launches per layer:
// norm_qkv_kv_write (the residual add of the previous product + RMSNorm, q/k/v matvec,
// biases, q/k norms, RoPE, K/V store, row norms), attention (split over key chunks, the
// last block of each head merging them), the Wo matvec, and norm_ffn (residual add +
// RMSNorm, gate/up matvec + activation, down matvec split over F and summed by the last
// block); plus embed, the final add + output_norm and the LM head: 4 L + 3 (Gemma 3's
// last post_ffw_norm: + 1). The fused kernels need Q4_1 / Q8_0 weights and a width that
// fits their shared memory; otherwise those ops run unfused (cuda_fused_ops.cpp).
// A batched decode step of B sequences on paged caches of one pool issues the same count
// whatever B: add + rmsnorm, q/k/v matvec, the rows ops (cuda_rows_ops.cpp: RoPE + store
// for every row in one launch, one split + merge pair of attention), Wo, then add +
// rmsnorm, gate/up + activation, down (norm_ffn unfused for several rows): 9 L + 3 (per
// sequence, RoPE + store and attention made it 6 + 3 B per layer). Past
// opt_.matvec_max_tokens rows the products go to the batched quantized GEMM, and past
// opt_.batched_max_tokens to cuBLAS (q/k/v three GEMMs, gate/up two and the activation).
// A batched decode step of up to 64 rows is recorded and replayed as a CUDA graph like a
// single decode step (one graph per batch size: decode_graph.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_kv_cache.h"
#include "engine/cuda/cuda_util.h"
#include "engine/cuda/cuda_weights.h"
#include "engine/cuda/decode_graph.h"
#include "engine/cuda/op_launcher.h"
#include "kernels/kernels.h"

namespace kvscope {

// The kernels' forms of a layer's RoPE and of the gated activation.
inline kvscope::cuda::RopeArgs rope_args(const RopeSpec& r) {
  return {r.n_rot, r.style == RopeStyle::NeoX ? 1 : 0, r.base, r.freq_scale};
}
inline kvscope::cuda::GateAct gate_act(FfnAct a) {
  return a == FfnAct::GeluTanh ? kvscope::cuda::GateAct::GeluTanh : kvscope::cuda::GateAct::Silu;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(CudaDeviceInfo info, CudaBackendOptions opt);
  ~CudaBackend() override;
  Status init(const Model& model);

  std::string name() const override;
  const char* kind() const override { return "cuda"; }
  int threads() const override { return 0; }  // the ops run on the GPU
  bool can_measure_kv_errors() const override { return true; }
  Expected<std::shared_ptr<KvPool>> create_kv_pool(const KvPoolConfig& config) override;
  Expected<std::unique_ptr<KvCache>> create_paged_kv_cache(const KvCacheConfig& config,
                                                           std::shared_ptr<KvPool> pool) override;
  void begin_step() override;
  std::optional<double> end_step() override;
  // cuda_sampling.cpp
  bool can_sample_on_device() const override { return true; }
  Status sample_candidates(Tensor logits_row, int n, float temperature,
                           DeviceCandidates& out) override;
  Status sampled_row(float* host) override;
  Status sample_candidates_rows(Tensor rows, int n, float temperature,
                                std::vector<DeviceCandidates>& out) override;
  Status download_async(Tensor src, float* host) override;
  Status download_wait() override;

 protected:
  // Ops, called with arguments Backend's wrappers have checked (engine/backend.cpp).
  // cuda_backend.cpp
  Expected<Tensor> do_scratch(int slot, int64_t rows, int64_t cols) override;
  Expected<std::unique_ptr<KvCache>> do_create_kv_cache(const KvCacheConfig& config,
                                                        int capacity) override;
  Status do_download(Tensor src, float* host) override;
  // cuda_ops.cpp
  Status do_embed(const Weight& tok_embd, const int32_t* ids, float scale, Tensor out) override;
  Status do_rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) override;
  Status do_matmul(const Weight& w, Tensor x, Tensor out) override;
  Status do_add_bias(Tensor x, const Weight& b) override;
  Status do_rope(Tensor x, int n_heads, int head_dim, const RopeSpec& r, int pos0) override;
  Status do_kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) override;
  Status do_attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head,
                      float scale, Tensor out, Tensor probs_last) override;
  Status do_glu(Tensor gate, Tensor up, FfnAct act, Tensor out) override;
  Status do_add(Tensor x, Tensor y) override;
  Status do_kv_rerotate(KvCache& cache, int layer, const RopeSpec& r, int first,
                        int delta) override;
  Status do_kv_row_norms(const KvCache& cache, int layer, int pos0, int T, Tensor k_norm,
                         Tensor v_norm) override;
  Status do_kv_row_errors(const KvCache& cache, int layer, int pos0, Tensor k, Tensor v,
                          Tensor k_err, Tensor v_err) override;
  Status do_matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x, Tensor q,
                       Tensor k, Tensor v) override;
  Status do_matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x, FfnAct act,
                       Tensor out, Tensor up) override;
  Status do_rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer, int n_head,
                          const RopeSpec& r, int pos0) override;
  Status do_add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out) override;
  // cuda_fused_ops.cpp
  Status do_norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a) override;
  Status do_norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                     Tensor out) override;
  // cuda_rows_ops.cpp
  Status do_rope_kv_write_rows(Tensor q, Tensor k, Tensor v, const DecodeRows& rows, int layer,
                               int n_head, const RopeSpec& r) override;
  Status do_attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head, float scale,
                           Tensor out) override;

 private:
  // The device position argument of a decode step being recorded (nullptr when eager, or
  // when this op's pos0 differs from the step's: the step then runs without a graph).
  const int* step_pos(int pos0);
  // The scratch slot holding t's data and t's row index in it (rows of t.cols floats);
  // nullptr when t is not inside a slot at a whole row.
  float* slot_base(Tensor t, int64_t* row0) const;
  // The rows ops' per-row device metadata for `layer` (rows_ prepared for this batch);
  // nullptr when the rows cannot share a launch there (caches not paged over one pool, or
  // laid out differently): the caller then runs the per-sequence ops.
  Expected<const kvscope::cuda::KvRowRef*> row_refs(const DecodeRows& rows, int layer);
  // The fused kernels' residual arguments; false when rn has no one-launch form (more
  // than one row, too wide for shared memory).
  Expected<bool> residual_args(const ResidualNorm& rn, kvscope::cuda::ResidualArgs* r);
  // At least n zeroed counters of sync_ (grown, and the recorded launches flushed, first
  // when fewer).
  Expected<unsigned*> sync_counters(int n);
  // b grown to at least `floats` floats (a recording is flushed first: its launches may
  // point into the old buffer).
  Expected<float*> work_buffer(DeviceBuffer& b, int64_t floats, const char* what);
  // At least n floats of norm_ffn's work memory (work_buffer on ffn_work_).
  Expected<float*> ffn_work(int64_t n);
  // The device sampler over rows [R][V] into out[0 .. R) (cuda_sampling.cpp), with a copy
  // of the row when row_copy is given (R = 1); `what` names the op in errors.
  Status run_sampler(const char* what, Tensor rows, int n, float temperature, float* row_copy,
                     DeviceCandidates* out);
  // matmul_batched's split partials and counters for a product of T rows (nullptr, nullptr
  // when the matrix does not split).
  Status batched_split(const kvscope::cuda::QMatrix& q, int T, float** work, unsigned** counters);
  // out [T][n_out] = x [T][n_in] · Wᵀ with cuBLAS on W's fp32 copy (fp32 in, fp32 out).
  Status gemm_f32(DeviceWeight& d, Tensor x, Tensor out);

  CudaDeviceInfo info_;
  CudaBackendOptions opt_;
  bool pdl_ = false;  // programmatic dependent launch (CudaBackendOptions::programmatic_launch)
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cudaEvent_t ev_start_ = nullptr, ev_stop_ = nullptr;
  bool timing_ok_ = false;
  std::optional<WeightStore> weights_;
  std::vector<DeviceBuffer> slots_;
  DeviceBuffer ids_;   // [T] int32 token ids
  DeviceBuffer attn_work_;  // the split decode attention's partial results
  // Zeroed unsigned counters of the kernels whose last block finishes the op
  // (kernels/last_block.cuh): [0] norm_qkv_kv_write, [1] norm_ffn, [2, 2 + H) the decode
  // attention's heads. Every launch leaves them zero; launches on the one stream never
  // overlap.
  DeviceBuffer sync_;
  DeviceBuffer ffn_work_;  // norm_ffn's partial down products [F/32][C]
  DeviceBuffer batched_work_;  // matmul_batched's split partials [S][T][n_out]
  // The rows ops' batch (cuda_rows_ops.cpp): metadata of every layer for the batch last
  // seen, uploaded in one copy when the batch (caches, positions, layouts) changes.
  struct RowsBatch {
    std::vector<int64_t> key;                    // per row: cache, position, version
    std::vector<int64_t> next_key;               // the call's key, built here
    std::vector<kvscope::cuda::KvRowRef> refs;   // [L][B]
    std::vector<kvscope::cuda::KvLayer> shared;  // [L] the layer's fields shared by rows
    std::vector<int> max_slots;                  // [L]
    std::vector<char> ok;                        // [L] the rows can share a launch
    DeviceBuffer dev;                            // refs on the device
    DeviceBuffer work;                           // attention_rows' partial results
    std::vector<DeviceBuffer> retired;           // outgrown work buffers a recorded step reads
    int uploads = 0;                             // metadata copies made (tests)
    bool dev_current = false;                    // dev holds refs for key
    // Refs staged with the decode step being recorded (one entry per run of rows).
    std::vector<std::pair<std::vector<int64_t>, const void*>> staged;
    uint64_t staged_serial = 0;                  // the step they belong to
  } rows_;
  // The device sampler (cuda_sampling.cpp): its work memory, the last row it was given,
  // its results, and pinned host memory for those results and for download_async.
  struct PinnedBuffer {
    void* p = nullptr;
    size_t bytes = 0;
    PinnedBuffer() = default;
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    ~PinnedBuffer() {
      if (p) cudaFreeHost(p);
    }
    Status ensure(size_t need, const char* what);
  };
  struct Sampling {
    DeviceBuffer work, out, row;
    int64_t row_cols = 0;  // floats in `row` (0: no row sampled yet)
    PinnedBuffer result;   // the header and the candidates
    PinnedBuffer stage;    // download_async's copies
    std::vector<std::pair<float*, size_t>> pending;  // (host, floats) at stage offsets
    size_t staged = 0;     // floats of stage in use
  } sampling_;
  int n_head_ = 0;
  DecodeGraph graph_;  // the decode step's launches, replayed as a CUDA graph
  std::optional<OpLauncher> ops_;
};

}  // namespace kvscope
