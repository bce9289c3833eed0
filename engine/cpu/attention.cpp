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
#include "engine/cpu/simd_scalar.h"
#include "engine/cpu/vec_math.h"

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
  const float* q;
  int64_t q_cols;
  const CpuKvCache* cache;
  int layer, pos0, n_head, G, D, Hkv;
  float scale;
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
  a.k_base = c.k_row(job.layer, hk, 0);
  a.v_base = c.v_row(job.layer, hk, 0);
  a.k_row_bytes = kv_row_bytes(c.types().k, job.D);
  a.v_row_bytes = kv_row_bytes(c.types().v, job.D);
  a.k_type = c.types().k;
  a.v_type = c.types().v;
  a.slots = job.slots + r.begin;
  a.n = r.end - r.begin;
  a.D = job.D;
  a.G = job.G;
  a.scale = job.scale;
  a.e = o.e;
  a.m = o.m;
  a.sum = o.sum;
  a.acc = o.acc;
  job.k->attn_chunk(a);
}

// Weighs and adds the chunks of (t, hk) in order; writes out and, for the last query,
// the probabilities by position.
void combine(const Job& job, int t, int hk, const std::vector<Range>& chunks, float* parts) {
  const int G = job.G, D = job.D;
  const size_t stride = chunk_floats(G, D);
  const bool last = t == job.out.rows - 1 && job.probs_last.data;
  float acc[512];
  for (int g = 0; g < G; ++g) {
    float m = -INFINITY;
    for (size_t c = 0; c < chunks.size(); ++c)
      m = std::max(m, ChunkOut::at(parts + c * stride, G).m[g]);
    float sum = 0;
    std::fill_n(acc, D, 0.0f);
    for (size_t c = 0; c < chunks.size(); ++c) {
      const ChunkOut o = ChunkOut::at(parts + c * stride, G);
      const float f = vexp<VecScalar>(o.m[g] - m);
      sum = std::fma(o.sum[g], f, sum);
      for (int d = 0; d < D; ++d) acc[d] = std::fma(o.acc[g * D + d], f, acc[d]);
    }
    const float inv = 1.0f / sum;
    const int h = hk * G + g;
    float* out = job.out.data + t * job.out.cols + int64_t(h) * D;
    for (int d = 0; d < D; ++d) out[d] = acc[d] * inv;
    if (last) {
      float* row = job.probs_last.data + int64_t(h) * job.probs_last.cols;
      for (size_t c = 0; c < chunks.size(); ++c) {
        const ChunkOut o = ChunkOut::at(parts + c * stride, G);
        const float w = vexp<VecScalar>(o.m[g] - m) * inv;
        for (int j = chunks[c].begin; j < chunks[c].end; ++j)
          row[job.kpos[j]] = o.e[g * kAttnChunk + (j - chunks[c].begin)] * w;
      }
    }
  }
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
  const std::vector<int32_t> order = cache.slots_by_position(layer);
  const int n = int(order.size());
  scratch.key_pos.resize(size_t(n));
  for (int i = 0; i < n; ++i)
    scratch.key_pos[size_t(i)] = cache.slot_pos(layer)[size_t(order[size_t(i)])];
  // Vector kernels for the usual head sizes, the scalar path for any other.
  const bool vector_ok = D == 64 || D == 128 || D == 256;
  Job job{q.data,
          q.cols,
          &cache,
          layer,
          pos0,
          n_head,
          n_head / Hkv,
          D,
          Hkv,
          scale,
          order.data(),
          scratch.key_pos.data(),
          n,
          cache.rule(layer),
          out,
          probs_last,
          vector_ok ? &kernels(isa_active()) : &kernels_scalar()};
  if (probs_last.data)
    for (int h = 0; h < n_head; ++h)
      std::fill_n(probs_last.data + int64_t(h) * probs_last.cols, pos0 + T, 0.0f);

  const size_t stride = chunk_floats(job.G, D);
  const int64_t pairs = T * Hkv;
  if (pairs >= 4 * int64_t(pool.size())) {
    // Whole (query, KV head) pairs per thread.
    pool.parallel_for(pairs, [&](int64_t b, int64_t e) {
      thread_local std::vector<Range> chunks;
      thread_local std::vector<float> parts;
      for (int64_t it = b; it < e; ++it) {
        const int t = int(it / Hkv), hk = int(it % Hkv);
        query_chunks(job.kpos, n, job.rule, pos0 + t, chunks);
        if (parts.size() < chunks.size() * stride) parts.resize(chunks.size() * stride);
        for (size_t c = 0; c < chunks.size(); ++c)
          run_chunk(job, t, hk, chunks[c], parts.data() + c * stride);
        combine(job, t, hk, chunks, parts.data());
      }
    });
    return Status::Ok();
  }
  // Few pairs: their chunks spread over the threads, then combined here.
  std::vector<std::vector<Range>>& per_pair = scratch.chunks;
  per_pair.resize(size_t(pairs));
  scratch.items.clear();
  for (int64_t p = 0; p < pairs; ++p) {
    query_chunks(job.kpos, n, job.rule, pos0 + int(p / Hkv), per_pair[size_t(p)]);
    for (size_t c = 0; c < per_pair[size_t(p)].size(); ++c)
      scratch.items.push_back({int(p), int(c)});
  }
  const int64_t items = int64_t(scratch.items.size());
  std::vector<size_t> first(size_t(pairs) + 1, 0);  // each pair's first item
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
            scratch.parts.data() + first[size_t(p)] * stride);
  return Status::Ok();
}

}  // namespace kvscope::cpu
