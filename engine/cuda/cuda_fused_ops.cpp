// cuda_fused_ops.cpp — the CUDA backend's fused layer halves of a decode step
// (backend.h: norm_qkv_kv_write, norm_ffn): one launch each where the step has one row,
// the weights a native matvec (Q4_1, Q8_0) and the width fits the kernels' shared memory
// (kernels/norm_qkv_kv_write.cu, norm_ffn.cu); otherwise Backend's unfused composition.
// The kernels' last blocks use the backend's zeroed counters (sync_).
#include <algorithm>

#include "engine/cuda/cuda_backend_impl.h"
#include "kernels/kernels.h"

namespace kvscope {
namespace {

using kvscope::cuda::QMatrix;

}  // namespace

Expected<unsigned*> CudaBackend::sync_counters(int n) {
  const size_t need = size_t(n) * sizeof(unsigned);
  if (need > sync_.bytes) {
    KV_TRY(graph_.flush());  // recorded launches may point into the old buffer
    KV_TRY(sync_.ensure(need, "kernel counters"));
    KV_TRY(cuda_check(cudaMemsetAsync(sync_.p, 0, sync_.bytes, stream_),
                      "zeroing the kernel counters"));
  }
  return static_cast<unsigned*>(sync_.p);
}

Expected<float*> CudaBackend::work_buffer(DeviceBuffer& b, int64_t floats, const char* what) {
  const size_t need = size_t(std::max<int64_t>(floats, 1)) * sizeof(float);
  if (need > b.bytes) {
    KV_TRY(graph_.flush());  // recorded launches may point into the old buffer
    KV_TRY(b.ensure(need, what));
  }
  return static_cast<float*>(b.p);
}

Expected<float*> CudaBackend::ffn_work(int64_t n) {
  return work_buffer(ffn_work_, n, "feed-forward work memory");
}

Status CudaBackend::batched_split(const QMatrix& q, int T, float** work, unsigned** counters) {
  *work = nullptr;
  *counters = nullptr;
  const int n = kvscope::cuda::matmul_batched_counters(q, T, opt_.batched_target_blocks);
  if (n <= 0) return Status::Ok();
  auto w = work_buffer(batched_work_,
                       kvscope::cuda::matmul_batched_work_floats(q, T, opt_.batched_target_blocks),
                       "batched product work memory");
  if (!w.ok()) return w.error();
  // Counters [2 + n_head, ...): after the fused ops' two and attention's per-head ones.
  auto sync = sync_counters(2 + n_head_ + n);
  if (!sync.ok()) return sync.error();
  *work = *w;
  *counters = *sync + 2 + n_head_;
  return Status::Ok();
}

Expected<bool> CudaBackend::residual_args(const ResidualNorm& rn, kvscope::cuda::ResidualArgs* r) {
  if (rn.x.rows != 1 || rn.x.cols > kvscope::cuda::residual_norm_max_width()) return false;
  auto w = weights_->get(*rn.w);
  if (!w.ok()) return w.error();
  r->x = rn.x.data;
  r->y = rn.y.data;
  r->y_norm = nullptr;
  if (rn.y.data && rn.y_norm) {
    auto yn = weights_->get(*rn.y_norm);
    if (!yn.ok()) return yn.error();
    r->y_norm = (*yn)->vec();
  }
  r->w = (*w)->vec();
  r->h = rn.h.data;
  r->C = int(rn.x.cols);
  r->eps = rn.eps;
  return true;
}

Status CudaBackend::do_norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a) {
  kvscope::cuda::ResidualArgs r;
  auto fused = residual_args(rn, &r);
  if (!fused.ok()) return fused.error();
  const Weight* ws[3] = {a.wq, a.wk, a.wv};
  QMatrix m[3];
  bool native = *fused && rn.x.cols % 32 == 0;
  for (int i = 0; i < 3; ++i) {
    auto d = weights_->get(*ws[i]);
    if (!d.ok()) return d.error();
    m[i] = (*d)->q;
    native = native && kvscope::cuda::matmul_native(m[i].type);
  }
  if (!native) return unfused_norm_qkv_kv_write(rn, a);
  kvscope::cuda::QkvPost p;
  const Weight* vecs[5] = {a.bq, a.bk, a.bv, a.q_norm, a.k_norm};
  const float** dst[5] = {&p.bq, &p.bk, &p.bv, &p.q_norm, &p.k_norm};
  for (int i = 0; i < 5; ++i) {
    if (!vecs[i]) continue;
    auto d = weights_->get(*vecs[i]);
    if (!d.ok()) return d.error();
    *dst[i] = (*d)->vec();
  }
  p.H = a.n_head;
  p.rope = rope_args(a.rope);
  p.pos0_dev = step_pos(a.pos0);
  p.pos0 = p.pos0_dev ? 0 : a.pos0;
  p.k_row_norm = a.k_row_norm.data;
  p.v_row_norm = a.v_row_norm.data;
  auto& c = static_cast<CudaKvCache&>(*a.cache);
  auto sync = sync_counters(2);
  if (!sync.ok()) return sync.error();
  return ops_->run("norm_qkv_kv_write kernel", kvscope::cuda::norm_qkv_kv_write, r, m[0], m[1],
                   m[2], p, a.q.data, a.k.data, a.v.data, c.layer(a.layer), *sync + 0);
}

Status CudaBackend::do_norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                                Tensor out) {
  kvscope::cuda::ResidualArgs r;
  auto fused = residual_args(rn, &r);
  if (!fused.ok()) return fused.error();
  const Weight* ws[3] = {w.gate, w.up, w.down};
  QMatrix m[3];
  bool native = *fused && rn.x.cols % 32 == 0 && w.gate->n_out % 32 == 0;
  for (int i = 0; i < 3; ++i) {
    auto d = weights_->get(*ws[i]);
    if (!d.ok()) return d.error();
    m[i] = (*d)->q;
    native = native && kvscope::cuda::matmul_native(m[i].type);
  }
  if (!native) return unfused_norm_ffn(rn, w, gate, up, out);
  auto work = ffn_work(kvscope::cuda::norm_ffn_work_floats(w.gate->n_out, rn.x.cols));
  if (!work.ok()) return work.error();
  auto sync = sync_counters(2);
  if (!sync.ok()) return sync.error();
  return ops_->run("norm_ffn kernel", kvscope::cuda::norm_ffn, r, m[0], m[1], m[2], gate_act(w.act),
                   *work, out.data, *sync + 1);
}

}  // namespace kvscope
