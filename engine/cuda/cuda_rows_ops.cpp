// cuda_rows_ops.cpp — the decode-rows ops (backend.h: rope_kv_write_rows, attention_rows)
// on the GPU: B sequences' decode rows in one launch (rope + K/V store) and one split +
// merge pair (attention) per layer, instead of one or two launches per sequence.
//
// Each row reaches its own cache through a KvRowRef (kernels.h): its block table and slot
// map for the layer, its slot count and position. The refs of every layer for the batch
// go to the device in one copy, made by the first rows op of a step (layer 0's
// rope_kv_write_rows) and reused by the later layers: the key is each row's cache, its
// position and its layout version, so a new step, a grown table or a relayout uploads
// anew. While a decode step is recorded (decode_graph.h) the refs are staged with the
// step's parameters instead, so that the launches read fixed addresses and replay as a
// graph. Rows whose caches are not paged over one pool with the same layer layout (pool
// storage, types, window) run the per-sequence ops (Backend's default).
#include <algorithm>

#include "engine/cuda/cuda_backend_impl.h"
#include "kernels/kernels.h"

namespace kvscope {
namespace {

using kvscope::cuda::KvLayer;
using kvscope::cuda::KvRowRef;

// Whether two rows' layers share the fields the rows kernels take from one KvLayer.
bool same_layout(const KvLayer& a, const KvLayer& b) {
  return a.k == b.k && a.v == b.v && a.k_type == b.k_type && a.v_type == b.v_type &&
         a.n_head_kv == b.n_head_kv && a.head_dim == b.head_dim && a.sink == b.sink &&
         a.window == b.window && a.stride == b.stride && a.block == b.block;
}

}  // namespace

Expected<const KvRowRef*> CudaBackend::row_refs(const DecodeRows& rows, int layer) {
  const int B = rows.n, L = rows.caches[0]->shape().n_layer;
  std::vector<int64_t>& key = rows_.next_key;  // reused: a decode step allocates nothing here
  key.clear();
  key.push_back(L);
  for (int b = 0; b < B; ++b) {
    const auto* c = static_cast<const CudaKvCache*>(rows.caches[b]);
    key.push_back(int64_t(reinterpret_cast<uintptr_t>(c)));
    key.push_back(rows.pos[b]);
    key.push_back(int64_t(c->version()));
  }
  if (key != rows_.key) {
    rows_.key.swap(key);
    rows_.dev_current = false;
    rows_.refs.assign(size_t(L) * size_t(B), KvRowRef{});
    rows_.shared.assign(size_t(L), KvLayer{});
    rows_.max_slots.assign(size_t(L), 0);
    rows_.ok.assign(size_t(L), 0);
    const KvPool* pool = rows.caches[0]->pool();
    bool paged = pool != nullptr;
    for (int b = 1; b < B && paged; ++b) paged = rows.caches[b]->pool() == pool;
    for (int l = 0; l < L && paged; ++l) {
      const KvLayer kl0 = static_cast<const CudaKvCache*>(rows.caches[0])->layer(l);
      bool ok = kl0.block > 0;
      int max_slots = 0;
      for (int b = 0; b < B && ok; ++b) {
        const KvLayer kl = static_cast<const CudaKvCache*>(rows.caches[b])->layer(l);
        ok = same_layout(kl, kl0) && kl.blocks != nullptr && kl.pos != nullptr && kl.n_slots > 0;
        rows_.refs[size_t(l) * size_t(B) + size_t(b)] =
            KvRowRef{kl.blocks, kl.pos, kl.n_slots, rows.pos[b]};
        max_slots = std::max(max_slots, kl.n_slots);
      }
      // The rows kernels take blocks, pos and n_slots from each row's ref: clear row 0's
      // in the shared layer, so that the launch (and a graph's key) does not change when
      // row 0's table grows. max_slots sizes the attention grid (chunks past a row's
      // slots exit at once): rounded up to a power of two, so that it changes (and a
      // graph is captured anew) only when the longest cache doubles.
      KvLayer shared = kl0;
      shared.blocks = nullptr;
      shared.pos = nullptr;
      shared.n_slots = 0;
      rows_.shared[size_t(l)] = shared;
      int rounded = 16;
      while (rounded < max_slots) rounded *= 2;
      rows_.max_slots[size_t(l)] = rounded;
      rows_.ok[size_t(l)] = ok;
    }
  }
  if (!rows_.ok[size_t(layer)]) return static_cast<const KvRowRef*>(nullptr);
  if (graph_.recording()) {
    // A recorded step: the refs of every layer go with the step's parameters (one upload
    // per step, at fixed device addresses: decode_graph.h), once per run of rows.
    for (const auto& [run_key, dev] : rows_.staged)
      if (rows_.staged_serial == graph_.step_serial() && run_key == rows_.key)
        return static_cast<const KvRowRef*>(dev) + size_t(layer) * size_t(B);
    if (rows_.staged_serial != graph_.step_serial()) rows_.staged.clear();
    rows_.staged_serial = graph_.step_serial();
    if (const void* dev = graph_.stage(rows_.refs.data(), rows_.refs.size() * sizeof(KvRowRef))) {
      rows_.staged.emplace_back(rows_.key, dev);
      return static_cast<const KvRowRef*>(dev) + size_t(layer) * size_t(B);
    }
    KV_TRY(graph_.flush());  // no room: the rest of this step runs eagerly
  }
  if (!rows_.dev_current) {
    const size_t bytes = rows_.refs.size() * sizeof(KvRowRef);
    if (bytes > rows_.dev.bytes) {
      KV_TRY(graph_.flush());  // recorded launches may point into the old buffer
      KV_TRY(rows_.dev.ensure(std::max(bytes, rows_.dev.bytes + rows_.dev.bytes / 2),
                              "the decode rows' cache references"));
    }
    // Pageable source: the call returns once the bytes are staged; the copy is ordered
    // before the launches that read it.
    KV_TRY(cuda_check(
        cudaMemcpyAsync(rows_.dev.p, rows_.refs.data(), bytes, cudaMemcpyHostToDevice, stream_),
        "uploading the decode rows' cache references"));
    ++rows_.uploads;
    rows_.dev_current = true;
  }
  return static_cast<const KvRowRef*>(rows_.dev.p) + size_t(layer) * size_t(B);
}

Status CudaBackend::do_rope_kv_write_rows(Tensor q, Tensor k, Tensor v, const DecodeRows& rows,
                                          int layer, int n_head, const RopeSpec& r) {
  auto refs = row_refs(rows, layer);
  if (!refs.ok()) return refs.error();
  if (*refs == nullptr) return Backend::do_rope_kv_write_rows(q, k, v, rows, layer, n_head, r);
  return ops_->run("rope_kv_write_rows kernel", kvscope::cuda::rope_kv_write_rows, q.data, k.data,
                   v.data, rows.n, n_head, rope_args(r), rows_.shared[size_t(layer)], *refs);
}

Status CudaBackend::do_attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head,
                                      float scale, Tensor out) {
  auto refs = row_refs(rows, layer);
  if (!refs.ok()) return refs.error();
  if (*refs == nullptr || rows_.shared[size_t(layer)].head_dim > 512)
    return Backend::do_attention_rows(q, rows, layer, n_head, scale, out);
  const KvLayer& kl = rows_.shared[size_t(layer)];
  const int max_slots = rows_.max_slots[size_t(layer)];
  const size_t need =
      size_t(kvscope::cuda::attention_rows_work_floats(rows.n, n_head, kl, max_slots)) * 4;
  if (need > rows_.work.bytes) {
    // Recorded launches of this step may point into the old buffer: it lives on until the
    // step has run (freed at the next step's embed), so the step stays one graph and the
    // next step, with the same buffer, replays it.
    if (graph_.recording())
      rows_.retired.push_back(std::move(rows_.work));
    else
      KV_TRY(graph_.flush());
    KV_TRY(rows_.work.ensure(std::max(need + need / 2, rows_.work.bytes + rows_.work.bytes / 2),
                             "attention work memory"));
  }
  return ops_->run("attention_rows kernel", kvscope::cuda::attention_rows, q.data, kl, *refs,
                   rows.n, max_slots, n_head, scale, out.data, static_cast<float*>(rows_.work.p));
}

}  // namespace kvscope
