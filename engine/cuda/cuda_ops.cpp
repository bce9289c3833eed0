// cuda_ops.cpp — the CUDA backend's ops (see backend.h for each op's contract; Backend's
// wrappers have checked the shapes). Each op finds its weights on the device and issues
// kernels through OpLauncher,
// which runs them now or records them into the decode step (op_launcher.h). Products of
// more than opt_.batched_max_tokens rows go to cuBLAS on fp32 weight copies; more than
// opt_.matvec_max_tokens up to that, to the batched quantized GEMM (every type); shorter
// ones to the quantized matvec kernels (Q4_1, Q8_0) or the fp32 matvec on a dequantized copy.
#include <algorithm>

#include "engine/cuda/cuda_backend_impl.h"
#include "engine/quant.h"
#include "kernels/kernels.h"

namespace kvscope {
namespace {

using kvscope::cuda::QMatrix;

}  // namespace

Status CudaBackend::do_embed(const Weight& tok_embd, const int32_t* ids, float scale,
                             Tensor out) {
  const int T = int(out.rows);
  auto w = weights_->get(tok_embd);
  if (!w.ok()) return w.error();
  KV_TRY(graph_.flush());
  rows_.retired.clear();  // the steps that read them have run
  if (T == 1 && opt_.decode_graph) {
    // A decode step starts: record its launches; the token goes in with the step's
    // parameters (DecodeGraph::flush).
    graph_.begin(ids[0]);
    return ops_->run("embed kernel", kvscope::cuda::embed, (*w)->q, graph_.token_dev(), 1, scale,
                     out.data);
  }
  if (opt_.decode_graph && T <= std::min(opt_.batched_max_tokens, DecodeGraph::kMaxStepRows)) {
    // Possibly a batched decode step (B sequences' decode rows): record it too, the ids
    // staged with the step's parameters. A step that is not one (a short prefill) is
    // marked not graphable by its ops and runs eagerly at the flush.
    graph_.begin(0);
    if (const void* dev = graph_.stage(ids, size_t(T) * sizeof(int32_t)))
      return ops_->run("embed kernel", kvscope::cuda::embed, (*w)->q,
                       static_cast<const int32_t*>(dev), T, scale, out.data);
    KV_TRY(graph_.flush());  // no room: this step runs eagerly
  }
  KV_TRY(ids_.ensure(size_t(T) * sizeof(int32_t), "token ids"));
  KV_TRY(cuda_check(
      cudaMemcpyAsync(ids_.p, ids, size_t(T) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
      "copying token ids"));
  // The host ids may change after we return: wait until the copy has read them.
  KV_TRY(cuda_check(cudaStreamSynchronize(stream_), "copying token ids"));
  return ops_->run("embed kernel", kvscope::cuda::embed, (*w)->q,
                   static_cast<const int32_t*>(ids_.p), T, scale, out.data);
}

Status CudaBackend::do_rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) {
  auto d = weights_->get(w);
  if (!d.ok()) return d.error();
  return ops_->run("rmsnorm kernel", kvscope::cuda::rmsnorm, x.data, (*d)->vec(), int(x.rows),
                   int(x.cols), eps, out.data);
}

Status CudaBackend::do_matmul(const Weight& w, Tensor x, Tensor out) {
  auto dw = weights_->get(w);
  if (!dw.ok()) return dw.error();
  DeviceWeight& d = **dw;
  const int T = int(x.rows);
  if (T <= opt_.matvec_max_tokens && kvscope::cuda::matmul_native(d.q.type))
    return ops_->run("matmul kernel", kvscope::cuda::matmul, d.q, x.data, T, out.data);
  // A batch of rows (batched decode, short prefill): the quantized GEMM, no fp32 copy.
  if (T > opt_.matvec_max_tokens && T <= opt_.batched_max_tokens &&
      kvscope::cuda::matmul_batched_supported(d.q.type)) {
    float* work = nullptr;
    unsigned* counters = nullptr;
    KV_TRY(batched_split(d.q, T, &work, &counters));
    return ops_->run("matmul_batched kernel", kvscope::cuda::matmul_batched, d.q, x.data, T,
                     out.data, work, counters, opt_.batched_target_blocks);
  }
  // A one-time conversion, issued now: no recorded launch reads the copy before it exists.
  KV_TRY(weights_->ensure_f32(d));
  if (T <= opt_.matvec_max_tokens)
    return ops_->run("matmul_f32 kernel", kvscope::cuda::matmul_f32, d.mat_f32(), w.n_in, w.n_out,
                     x.data, T, out.data);
  KV_TRY(graph_.flush());
  return gemm_f32(d, x, out);
}

Status CudaBackend::gemm_f32(DeviceWeight& d, Tensor x, Tensor out) {
  // out^T (n_out x T, column-major) = W^T-as-stored (n_out x n_in) * x^T (n_in x T), all fp32
  // with fp32 accumulation: activations keep their full range (Gemma's residual exceeds fp16).
  const int n_in = int(d.q.n_in), n_out = int(d.q.n_out), T = int(x.rows);
  const float one = 1.0f, zero = 0.0f;
  return cublas_check(
      cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &one, d.mat_f32(), CUDA_R_32F,
                   n_in, x.data, CUDA_R_32F, n_in, &zero, out.data, CUDA_R_32F, n_out,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "GemmEx");
}

Status CudaBackend::do_add_bias(Tensor x, const Weight& b) {
  auto d = weights_->get(b);
  if (!d.ok()) return d.error();
  return ops_->run("add_bias kernel", kvscope::cuda::add_bias, x.data, (*d)->vec(), int(x.rows), x.cols);
}

Status CudaBackend::do_rope(Tensor x, int n_heads, int head_dim, const RopeSpec& r, int pos0) {
  if (graph_.recording()) graph_.not_graphable();  // pos0 is a plain argument of this kernel
  return ops_->run("rope kernel", kvscope::cuda::rope, x.data, int(x.rows), n_heads, head_dim,
                   rope_args(r), pos0);
}

Status CudaBackend::do_kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) {
  auto& c = static_cast<CudaKvCache&>(cache);
  if (graph_.recording()) graph_.not_graphable();  // pos0 is a plain argument of this kernel
  return ops_->run("kv_write kernel", kvscope::cuda::kv_write, c.layer(layer), k.data, v.data,
                   int(k.rows), pos0);
}

Status CudaBackend::do_attention(Tensor q, const KvCache& cache, int layer, int pos0,
                                 int n_head, float scale, Tensor out, Tensor probs_last) {
  const auto& c = static_cast<const CudaKvCache&>(cache);
  const int n_keys = int(pos0 + q.rows);
  const kvscope::cuda::KvLayer kl = c.layer(layer);
  if (q.rows == 1 && kl.head_dim <= 512) {
    // A decode step: the split kernel, whose chunks spread a long cache over the GPU.
    const size_t need = size_t(kvscope::cuda::attention_decode_work_floats(n_head, kl)) * 4;
    if (need > attn_work_.bytes) {
      KV_TRY(graph_.flush());  // recorded launches may point into the old buffer
      KV_TRY(attn_work_.ensure(std::max(need + need / 2, attn_work_.bytes + attn_work_.bytes / 2),
                               "attention work memory"));
    }
    auto* work = static_cast<float*>(attn_work_.p);
    auto sync = sync_counters(2 + n_head);  // [2, 2 + H): the heads' merge counters
    if (!sync.ok()) return sync.error();
    unsigned* counters = *sync + 2;
    if (graph_.recording()) {
      int64_t row0 = 0;
      float* base = probs_last.data ? slot_base(probs_last, &row0) : nullptr;
      if (probs_last.cols == n_keys && (probs_last.data == nullptr || base != nullptr) &&
          graph_.use_pos0(pos0))
        return ops_->run("attention kernel", kvscope::cuda::attention_decode, q.data, kl, 0,
                         graph_.pos0_dev(), n_head, scale, out.data, base, int64_t(-1), row0, work,
                         counters);
      graph_.not_graphable();
    }
    return ops_->run("attention kernel", kvscope::cuda::attention_decode, q.data, kl, pos0,
                     static_cast<const int*>(nullptr), n_head, scale, out.data, probs_last.data,
                     probs_last.cols, int64_t(0), work, counters);
  }
  if (c.n_slots(layer) > kvscope::cuda::attention_max_keys())
    return make_error("cuda: attention over ", c.n_slots(layer),
                      " cache slots exceeds this GPU's limit of ",
                      kvscope::cuda::attention_max_keys(), " (shared memory per block)");
  if (graph_.recording()) {
    // Graph form: position from device memory, probability rows located by their row
    // index in a scratch slot (the row stride n_keys changes every step).
    int64_t row0 = 0;
    float* base = probs_last.data ? slot_base(probs_last, &row0) : nullptr;
    const bool ok = q.rows == 1 && probs_last.cols == n_keys &&
                    (probs_last.data == nullptr || base != nullptr) && graph_.use_pos0(pos0);
    if (ok)
      return ops_->run("attention kernel", kvscope::cuda::attention_dev, q.data, kl, 1,
                       graph_.pos0_dev(), n_head, scale, out.data, base, row0);
    graph_.not_graphable();
  }
  return ops_->run("attention kernel", kvscope::cuda::attention, q.data, kl, int(q.rows), pos0,
                   n_head, scale, out.data, probs_last.data, probs_last.cols);
}

Status CudaBackend::do_glu(Tensor gate, Tensor up, FfnAct act, Tensor out) {
  return ops_->run("glu kernel", kvscope::cuda::glu, gate.data, up.data, gate.size(),
                   gate_act(act), out.data);
}

Status CudaBackend::do_add(Tensor x, Tensor y) {
  return ops_->run("add kernel", kvscope::cuda::add, x.data, y.data, x.size());
}

Status CudaBackend::do_kv_rerotate(KvCache& cache, int layer, const RopeSpec& r, int first,
                                   int delta) {
  const auto& c = static_cast<const CudaKvCache&>(cache);
  return ops_->run("kv_rerotate kernel", kvscope::cuda::kv_rerotate, c.layer(layer), rope_args(r),
                   first, delta);
}

Status CudaBackend::do_kv_row_norms(const KvCache& cache, int layer, int pos0, int T,
                                    Tensor k_norm, Tensor v_norm) {
  const auto& c = static_cast<const CudaKvCache&>(cache);
  const int* pos_dev = step_pos(pos0);
  return ops_->run("kv_row_norms kernel", kvscope::cuda::kv_row_norms, c.layer(layer), pos_dev ? 0 : pos0,
                   pos_dev, T, k_norm.data, v_norm.data);
}

Status CudaBackend::do_kv_row_errors(const KvCache& cache, int layer, int pos0, Tensor k,
                                     Tensor v, Tensor k_err, Tensor v_err) {
  const auto& c = static_cast<const CudaKvCache&>(cache);
  const int T = int(k.rows);
  const int* pos_dev = step_pos(pos0);
  return ops_->run("kv_row_errors kernel", kvscope::cuda::kv_row_errors, c.layer(layer), k.data,
                   v.data, T, pos_dev ? 0 : pos0, pos_dev, k_err.data, v_err.data);
}

// --- Fused ops. Each falls back to the unfused composition where no fused kernel
// applies (long products on cuBLAS, weights without a native matvec).

Status CudaBackend::do_matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv,
                                  Tensor x, Tensor q, Tensor k, Tensor v) {
  const Weight* ws[3] = {&wq, &wk, &wv};
  QMatrix m[3];
  bool native = x.rows <= opt_.matvec_max_tokens;
  for (int i = 0; i < 3; ++i) {
    auto d = weights_->get(*ws[i]);
    if (!d.ok()) return d.error();
    m[i] = (*d)->q;
    native = native && kvscope::cuda::matmul_native(m[i].type);
  }
  if (!native) return unfused_matmul_qkv(wq, wk, wv, x, q, k, v);
  return ops_->run("matmul_qkv kernel", kvscope::cuda::matmul_qkv, m[0], m[1], m[2], x.data,
                   int(x.rows), q.data, k.data, v.data);
}

Status CudaBackend::do_matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x,
                                  FfnAct act, Tensor out, Tensor up) {
  auto g = weights_->get(w_gate);
  if (!g.ok()) return g.error();
  auto u = weights_->get(w_up);
  if (!u.ok()) return u.error();
  if (x.rows > opt_.matvec_max_tokens || !kvscope::cuda::matmul_native((*g)->q.type) ||
      !kvscope::cuda::matmul_native((*u)->q.type))
    return unfused_matmul_glu(w_gate, w_up, x, act, out, up);
  return ops_->run("matmul_glu kernel", kvscope::cuda::matmul_glu, (*g)->q,
                   (*u)->q, x.data, int(x.rows), gate_act(act), out.data);
}

Status CudaBackend::do_rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer,
                                     int n_head, const RopeSpec& r, int pos0) {
  auto& c = static_cast<CudaKvCache&>(cache);
  const int* pos_dev = step_pos(pos0);
  return ops_->run("rope_kv_write kernel", kvscope::cuda::rope_kv_write, q.data, k.data,
                   v.data, int(q.rows), n_head, rope_args(r), c.layer(layer), pos_dev ? 0 : pos0,
                   pos_dev);
}

Status CudaBackend::do_add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps,
                                   Tensor out) {
  if (out.data == x.data || out.data == y.data) return unfused_add_rmsnorm(x, y, w, eps, out);
  auto d = weights_->get(w);
  if (!d.ok()) return d.error();
  return ops_->run("add_rmsnorm kernel", kvscope::cuda::add_rmsnorm, x.data, y.data,
                   (*d)->vec(), int(x.rows), int(x.cols), eps, out.data);
}

}  // namespace kvscope
