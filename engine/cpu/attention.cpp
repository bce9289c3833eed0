// attention.cpp — the CPU backend's grouped-query attention (see attention.h).
//
// For query t (position qp) and KV head hk, the visible keys (the layer's rule: causal,
// window, sinks) in ascending position order are cut into chunks at multiples of
// kAttnChunk positions (and where the visible keys have a gap). Each chunk runs the
// instruction set's kernel (attention_impl.h: K/V rows read in their stored type, once
// for the G heads of the group, vectorized exp) giving its max m_c, sum S_c and
// Σ e·v; combine() then weighs chunk c by f_c = exp(m_c − m), m = max_c m_c, adding
// chunks in order: out = (Σ_c f_c·acc_c) / (Σ_c f_c·S_c). A query's numbers therefore
// depend only on the positions it sees — not on T, the cache layout or the threads — so
// CACHE and NO CACHE stay bit-identical.
//
// Work split: with many (query, KV head) pairs (prefill, NO CACHE) each thread takes
// whole pairs, chunks in turn; with few (decode) the chunks of all pairs are spread
// over the threads and combined afterwards — threads over heads and over positions.
#include "engine/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/kernels.h"

namespace kvscope::cpu {
namespace {

using Range = AttnRange;

// The visible keys of a query at qp, as chunks of the ascending key positions kp[0, n).
// Chunks are cut in position space — the visible positions are [0, qp], or the sinks
// [0, sink) and the window [qp − window + 1, qp] when these do not touch, each cut at
// multiples of kAttnChunk — so they are the same whatever else the cache holds.
void query_chunks(const int32_t* kp, int n, const KvLayerRule& rule, int qp,
                  std::vector<Range>& out) {
  out.clear();
  int spans[2][2] = {{0, qp + 1}, {0, 0}};  // [begin, end) in positions
  int n_spans = 1;
  if (rule.window > 0) {
    const int sink_end = std::min(rule.sink, qp + 1), win_begin = std::max(0, qp - rule.window + 1);
    if (win_begin > sink_end) {
      spans[0][1] = sink_end;
      spans[1][0] = win_begin;
      spans[1][1] = qp + 1;
      n_spans = 2;
    }
  }
  for (int p = 0; p < n_spans; ++p)
    for (int a = spans[p][0]; a < spans[p][1];) {
      const int b = std::min(spans[p][1], (a / kAttnChunk + 1) * kAttnChunk);
      const int i = int(std::lower_bound(kp, kp + n, a) - kp);
      const int j = int(std::lower_bound(kp + i, kp + n, b) - kp);
      if (j > i) out.push_back({i, j});
      a = b;
    }
}

// Floats of one chunk's results for G heads of size D: e, m, sum, acc.
size_t chunk_floats(int G, int D) {
  return size_t(G) * (kAttnChunk + 2 + D);
}

struct ChunkOut {
  float *e, *m, *sum, *acc;  // [G][kAttnChunk], [G], [G], [G][D]
  static ChunkOut at(float* base, int G) {
    return {base, base + G * kAttnChunk, base + G * kAttnChunk + G, base + G * kAttnChunk + 2 * G};
  }
};

// Everything one call needs.
struct Job {
  const float* q;  // [T][H·D], times the score scale
  int64_t q_cols;
  const CpuKvCache* cache;
  int layer, pos0, n_head, G, D, Hkv;
  const int32_t* slots;  // [n] held slots, ascending position
  const int32_t* kpos;   // [n] their positions
  int n;
  KvLayerRule rule;
  Tensor out, probs_last;
  const IsaKernels* k;
};

void run_chunk(const Job& job, int t, int hk, Range r, float* dst) {
  const CpuKvCache& c = *job.cache;
  const ChunkOut o = ChunkOut::at(dst, job.G);
  AttnChunk a;
  a.q = job.q + t * job.q_cols + int64_t(hk) * job.G * job.D;
  a.k_base = c.k_base(job.layer, hk);
  a.v_base = c.v_base(job.layer, hk);
  a.k_row_bytes = kv_row_bytes(c.types().k, job.D);
  a.v_row_bytes = kv_row_bytes(c.types().v, job.D);
  a.k_type = c.types().k;
  a.v_type = c.types().v;
  a.slots = job.slots + r.begin;
  a.n = r.end - r.begin;
  a.n_after = job.n - r.end;
  a.D = job.D;
  a.G = job.G;
  a.e = o.e;
  a.m = o.m;
  a.sum = o.sum;
  a.acc = o.acc;
  job.k->attn_chunk(a);
}

// Weighs and adds the chunks of (t, hk) in order (attention_impl.h); writes out and, for
// the last query, its attention rows by position.
void combine(const Job& job, int t, int hk, const std::vector<Range>& chunks, const float* parts,
             std::vector<int32_t>& spans) {
  const bool last = t == job.out.rows - 1 && job.probs_last.data;
  spans.resize(2 * chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    spans[c] = job.kpos[chunks[c].begin];
    spans[chunks.size() + c] = chunks[c].end - chunks[c].begin;
  }
  AttnCombine a;
  a.G = job.G;
  a.D = job.D;
  a.n_chunks = int(chunks.size());
  a.parts = parts;
  a.stride = chunk_floats(job.G, job.D);
  a.out = job.out.data + t * job.out.cols + int64_t(hk) * job.G * job.D;
  a.probs = last ? job.probs_last.data + int64_t(hk) * job.G * job.probs_last.cols : nullptr;
  a.probs_cols = job.probs_last.cols;
  a.chunk_begin = spans.data();
  a.chunk_n = spans.data() + chunks.size();
  job.k->attn_combine(a);
}

}  // namespace

Status attention(ThreadPool& pool, Tensor q, const CpuKvCache& cache, int layer, int pos0,
                 int n_head, float scale, Tensor out, Tensor probs_last,
                 AttentionScratch& scratch) {
  const int D = cache.shape().head_dim, Hkv = cache.shape().n_head_kv;
  const int64_t T = q.rows;
  if (Hkv <= 0 || n_head % Hkv != 0 || D > 512)
    return make_error("cpu: attention with ", n_head, " heads over ", Hkv, " KV heads of size ", D,
                      " is not supported (heads must be a multiple of KV heads, size at most 512)");
  // The held slots in ascending position order: usually the slot order already (a full
  // layer, or a ring that has not wrapped), else sorted.
  std::vector<int32_t>& order = scratch.order;
  const std::vector<int32_t>& slot_pos = cache.slot_pos(layer);
  // Room for every slot the layer has, and for the chunks of that many keys: the buffers
  // below then grow when the cache does, not by one key at every decode step.
  const size_t n_slots = slot_pos.size(), max_chunks = n_slots / kAttnChunk + 3;
  order.reserve(n_slots);
  scratch.key_pos.reserve(n_slots);
  scratch.last.reserve(max_chunks);
  scratch.spans.reserve(2 * max_chunks);
  order.clear();
  bool ascending = true;
  for (int s = 0, last = -1; s < int(slot_pos.size()); ++s)
    if (slot_pos[size_t(s)] >= 0) {
      ascending = ascending && slot_pos[size_t(s)] > last;
      last = slot_pos[size_t(s)];
      order.push_back(s);
    }
  if (!ascending) cache.slots_by_position(layer, order);
  const int n = int(order.size());
  scratch.key_pos.resize(size_t(n));
  for (int i = 0; i < n; ++i) scratch.key_pos[size_t(i)] = slot_pos[size_t(order[size_t(i)])];
  // The kernels index rows from the head's base: a paged cache's rows are at physical slots.
  if (cache.paged())
    for (int32_t& s : order) s = cache.physical_slot(layer, s);
  // Vector kernels for the usual head sizes, the scalar path for any other.
  const bool vector_ok = D == 64 || D == 128 || D == 256;
  // The queries times the score scale (the kernels then need no multiply per key).
  scratch.q_scaled.resize(size_t(q.rows * q.cols));
  for (int64_t i = 0; i < q.rows * q.cols; ++i) scratch.q_scaled[size_t(i)] = q.data[i] * scale;
  Job job{scratch.q_scaled.data(),
          q.cols,
          &cache,
          layer,
          pos0,
          n_head,
          n_head / Hkv,
          D,
          Hkv,
          order.data(),
          scratch.key_pos.data(),
          n,
          cache.rule(layer),
          out,
          probs_last,
          vector_ok ? &kernels(isa_active()) : &kernels_scalar()};
  if (probs_last.data) {
    // The last query's attention rows: combine writes the positions it sees; the others
    // (past a window, or not held) are 0. Only those are cleared, not the whole row: at
    // long contexts a step's rows are megabytes.
    query_chunks(job.kpos, n, job.rule, pos0 + int(T) - 1, scratch.last);
    for (int h = 0; h < n_head; ++h) {
      float* row = probs_last.data + int64_t(h) * probs_last.cols;
      int at = 0;
      for (const Range& r : scratch.last) {
        const int first = job.kpos[r.begin];
        if (first > at) std::fill(row + at, row + first, 0.0f);
        at = std::max(at, first + (r.end - r.begin));
      }
      if (pos0 + T > at) std::fill(row + at, row + pos0 + T, 0.0f);
    }
  }

  const size_t stride = chunk_floats(job.G, D);
  const int64_t pairs = T * Hkv;
  if (pairs >= 4 * int64_t(pool.size())) {
    // Whole (query, KV head) pairs per thread.
    pool.parallel_for(pairs, [&](int64_t b, int64_t e) {
      thread_local std::vector<Range> chunks;
      thread_local std::vector<float> parts;
      thread_local std::vector<int32_t> spans;
      for (int64_t it = b; it < e; ++it) {
        const int t = int(it / Hkv), hk = int(it % Hkv);
        query_chunks(job.kpos, n, job.rule, pos0 + t, chunks);
        if (parts.size() < chunks.size() * stride) parts.resize(chunks.size() * stride);
        for (size_t c = 0; c < chunks.size(); ++c)
          run_chunk(job, t, hk, chunks[c], parts.data() + c * stride);
        combine(job, t, hk, chunks, parts.data(), spans);
      }
    });
    return Status::Ok();
  }
  // Few pairs: their chunks spread over the threads, then combined here.
  std::vector<std::vector<Range>>& per_pair = scratch.chunks;
  per_pair.resize(size_t(pairs));
  for (auto& chunks : per_pair) chunks.reserve(max_chunks);
  scratch.items.reserve(size_t(pairs) * max_chunks);
  if (scratch.parts.size() < size_t(pairs) * max_chunks * stride)
    scratch.parts.resize(size_t(pairs) * max_chunks * stride);
  scratch.items.clear();
  for (int64_t p = 0; p < pairs; ++p) {
    query_chunks(job.kpos, n, job.rule, pos0 + int(p / Hkv), per_pair[size_t(p)]);
    for (size_t c = 0; c < per_pair[size_t(p)].size(); ++c)
      scratch.items.push_back({int(p), int(c)});
  }
  const int64_t items = int64_t(scratch.items.size());
  std::vector<size_t>& first = scratch.first;  // each pair's first item
  first.assign(size_t(pairs) + 1, 0);
  for (int64_t p = 0; p < pairs; ++p)
    first[size_t(p) + 1] = first[size_t(p)] + per_pair[size_t(p)].size();
  if (scratch.parts.size() < size_t(items) * stride) scratch.parts.resize(size_t(items) * stride);
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto [p, c] = scratch.items[size_t(i)];
      run_chunk(job, int(p / Hkv), int(p % Hkv), per_pair[size_t(p)][size_t(c)],
                scratch.parts.data() + size_t(i) * stride);
    }
  };
  int64_t keys = 0;
  for (const auto& chunks : per_pair)
    for (const Range& r : chunks) keys += r.end - r.begin;
  if (keys * job.G * D < (int64_t(1) << 15)) {  // a hand-off would cost more
    run(0, items);
  } else {
    pool.parallel_for(items, run);
  }
  for (int64_t p = 0; p < pairs; ++p)
    combine(job, int(p / Hkv), int(p % Hkv), per_pair[size_t(p)],
            scratch.parts.data() + first[size_t(p)] * stride, scratch.spans);
  return Status::Ok();
}

}  // namespace kvscope::cpu
