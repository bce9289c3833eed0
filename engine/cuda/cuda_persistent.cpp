// cuda_persistent.cpp — the persistent decode step (CudaBackendOptions::persistent, an
// experiment that is off by default): the plan the ops of a recorded decode step fill in
// (cuda_backend_impl.h PersistentStep) and, once the LM head completes it, the one
// cooperative launch (kernels/decode_persistent.cu) that replaces the step's launches.
//
// The plan follows the forward's single-sequence decode step exactly: embed, then per
// layer norm_qkv_kv_write, attention, the Wo matvec, norm_ffn, then the final
// add + RMSNorm and the LM head — each op one recorded launch with the fused kernels'
// arguments (the attention's probability rows and the K/V row norms included). What the
// kernel does not cover (another op or order, unfused ops, a K/V type other than f16, a
// window or sink, a non-native weight, several sequences) drops the plan, and the step
// runs as recorded. DecodeGraph::flush makes the final check: the plan
// must stand for every launch the step recorded.
#include <cstring>

#include "engine/cuda/cuda_backend_impl.h"
#include "kernels/kernels.h"

namespace kvscope {
namespace {

using kvscope::cuda::KvElem;

// kv's fields into zeroed memory: no stray padding bytes, so that two steps with the same
// layers compare equal byte for byte (and the arguments are not uploaded again).
kvscope::cuda::KvLayer clean_kv(const kvscope::cuda::KvLayer& kv) {
  kvscope::cuda::KvLayer c;
  std::memset(static_cast<void*>(&c), 0, sizeof c);
  c.k = kv.k;
  c.v = kv.v;
  c.k_type = kv.k_type;
  c.v_type = kv.v_type;
  c.n_head_kv = kv.n_head_kv;
  c.head_dim = kv.head_dim;
  c.n_slots = kv.n_slots;
  c.sink = kv.sink;
  c.window = kv.window;
  c.pos = kv.pos;
  c.stride = kv.stride;
  c.blocks = kv.blocks;
  c.block = kv.block;
  c.block_shift = kv.block_shift;
  return c;
}

bool same_bytes(const std::vector<kvscope::cuda::DecodeLayerArgs>& a,
                const std::vector<kvscope::cuda::DecodeLayerArgs>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

}  // namespace

bool CudaBackend::persist_active() {
  return persist_.blocks > 0 && persist_.ok && graph_.recording() &&
         persist_.serial == graph_.step_serial();
}

void CudaBackend::persist_embed(kvscope::cuda::QMatrix table, float scale, float* x) {
  if (persist_.blocks <= 0 || !graph_.recording()) return;
  persist_.serial = graph_.step_serial();
  persist_.ok = true;
  persist_.layers.clear();
  persist_.args = kvscope::cuda::DecodeStepArgs{};
  persist_.args.tok_embd = table;
  persist_.args.token = graph_.token_dev();
  persist_.args.pos0_dev = graph_.pos0_dev();
  persist_.args.embd_scale = scale;
  persist_.args.x = x;
  persist_.next = PersistentStep::Next::kQkv;
  persist_.launches = 1;
}

void CudaBackend::persist_qkv(const kvscope::cuda::ResidualArgs& r, const kvscope::cuda::QMatrix* w,
                              const kvscope::cuda::QkvPost& p, float* q, float* k, float* v,
                              const kvscope::cuda::KvLayer& kv) {
  if (!persist_active()) return;
  kvscope::cuda::DecodeStepArgs& s = persist_.args;
  const bool first = persist_.layers.empty();
  const bool ok = (persist_.next == PersistentStep::Next::kQkv ||
                   persist_.next == PersistentStep::Next::kQkvOrFinal) &&
                  r.x == s.x && (first ? r.y == nullptr : r.y == persist_.layers.back().ffn_out) &&
                  r.y_norm == nullptr && (first || r.C == s.C) && p.pos0_dev == graph_.pos0_dev() &&
                  kv.k_type == KvElem::F16 && kv.v_type == KvElem::F16 && kv.window == 0 &&
                  kv.sink == 0;
  if (!ok) return persist_fail();
  kvscope::cuda::DecodeLayerArgs a{};
  a.attn_in = r;
  a.wq = w[0];
  a.wk = w[1];
  a.wv = w[2];
  a.post = p;
  a.q = q;
  a.k = k;
  a.v = v;
  a.kv = clean_kv(kv);
  s.C = r.C;
  persist_.layers.push_back(a);
  persist_.next = PersistentStep::Next::kAttention;
  ++persist_.launches;
}

void CudaBackend::persist_attention(const float* q, const kvscope::cuda::KvLayer& kv, int n_head,
                                    float scale, float* out, float* work, float* probs,
                                    int64_t probs_row0) {
  if (!persist_active()) return;
  if (persist_.next != PersistentStep::Next::kAttention) return persist_fail();
  kvscope::cuda::DecodeLayerArgs& a = persist_.layers.back();
  if (q != a.q || n_head != a.post.H || kv.k != a.kv.k || kv.v != a.kv.v ||
      kv.n_slots != a.kv.n_slots || kv.pos != a.kv.pos || kv.blocks != a.kv.blocks)
    return persist_fail();
  a.attn_scale = scale;
  a.attn_work = work;
  a.att = out;
  a.probs = probs;
  a.probs_row0 = probs_row0;
  persist_.next = PersistentStep::Next::kWo;
  ++persist_.launches;
}

void CudaBackend::persist_ffn(const kvscope::cuda::ResidualArgs& r, const kvscope::cuda::QMatrix* w,
                              kvscope::cuda::GateAct act, float* work, float* out) {
  if (!persist_active()) return;
  if (persist_.next != PersistentStep::Next::kFfn) return persist_fail();
  kvscope::cuda::DecodeLayerArgs& a = persist_.layers.back();
  if (r.x != persist_.args.x || r.y != a.o || r.y_norm != nullptr || r.C != persist_.args.C ||
      out != a.o)
    return persist_fail();
  a.ffn_in = r;
  a.w_gate = w[0];
  a.w_up = w[1];
  a.w_down = w[2];
  a.act = act;
  a.ffn_work = work;
  a.ffn_out = out;
  persist_.next = PersistentStep::Next::kQkvOrFinal;
  ++persist_.launches;
}

void CudaBackend::persist_final(float* x, const float* y, const float* w, int C, float eps,
                                float* h) {
  if (!persist_active()) return;
  if (persist_.next != PersistentStep::Next::kQkvOrFinal || x != persist_.args.x ||
      y != persist_.layers.back().ffn_out || C != persist_.args.C)
    return persist_fail();
  persist_.args.final_norm = kvscope::cuda::ResidualArgs{x, y, nullptr, w, h, C, eps};
  persist_.next = PersistentStep::Next::kHead;
  ++persist_.launches;
}

void CudaBackend::persist_matmul(const kvscope::cuda::QMatrix& w, const float* x, float* out) {
  if (!persist_active()) return;
  kvscope::cuda::DecodeStepArgs& s = persist_.args;
  if (persist_.next == PersistentStep::Next::kWo) {
    kvscope::cuda::DecodeLayerArgs& a = persist_.layers.back();
    if (x != a.att || !kvscope::cuda::matmul_native(w.type)) return persist_fail();
    a.wo = w;
    a.o = out;
    persist_.next = PersistentStep::Next::kFfn;
    ++persist_.launches;
    return;
  }
  if (persist_.next != PersistentStep::Next::kHead || x != s.final_norm.h ||
      !kvscope::cuda::matmul_native(w.type))
    return persist_fail();
  s.head = w;
  s.logits = out;
  persist_.next = PersistentStep::Next::kDone;
  ++persist_.launches;
  // The plan is whole: the layers' arguments to the device (when they changed: a cache
  // that grew, a moved buffer), then the one launch in place of the step's.
  if (!same_bytes(persist_.layers, persist_.uploaded)) {
    const size_t bytes = persist_.layers.size() * sizeof(persist_.layers[0]);
    if (!persist_.dev.ensure(bytes, "persistent decode step arguments").ok() ||
        cudaMemcpyAsync(persist_.dev.p, persist_.layers.data(), bytes, cudaMemcpyHostToDevice,
                        stream_) != cudaSuccess) {
      cudaGetLastError();
      persist_.uploaded.clear();
      return persist_fail();
    }
    persist_.uploaded = persist_.layers;
  }
  s.n_layer = int(persist_.layers.size());
  s.n_head = persist_.layers.front().post.H;
  s.F = int(persist_.layers.front().w_gate.n_out);
  s.layers = static_cast<const kvscope::cuda::DecodeLayerArgs*>(persist_.dev.p);
  const kvscope::cuda::DecodeStepArgs args = s;
  const int blocks = persist_.blocks;
  cudaStream_t st = stream_;
  graph_.substitute(persist_.launches, [args, blocks, st] {
    return kvscope::cuda::decode_persistent(args, blocks, st);
  });
}

}  // namespace kvscope
