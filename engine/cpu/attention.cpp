// attention.cpp — the CPU backend's grouped-query attention (see attention.h). The held
// keys are converted to fp32 once per call; one work item per (query row, head); keys
// are summed in ascending position order, so CACHE and NO CACHE stay bit-identical.
#include "engine/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/matmul.h"

namespace kvscope::cpu {

Status attention(ThreadPool& pool, Tensor q, const CpuKvCache& cache, int layer, int pos0,
                 int n_head, float scale, Tensor out, Tensor probs_last,
                 AttentionScratch& scratch) {
  const CpuKvCache& c = cache;
  const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
  const int group = n_head / Hkv;
  const int64_t T = q.rows;
  const KvLayerRule rule = c.rule(layer);
  // The held keys in ascending position order, as fp32: [2][Hkv][n][D], converted once
  // per call, and their positions.
  const std::vector<int32_t> order = c.slots_by_position(layer);
  const int n = int(order.size());
  scratch.key_pos.resize(size_t(n));
  for (int i = 0; i < n; ++i)
    scratch.key_pos[size_t(i)] = c.slot_pos(layer)[size_t(order[size_t(i)])];
  const size_t plane = size_t(n) * D;
  scratch.kv_f32.resize(2 * size_t(Hkv) * plane);
  auto convert = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int hk = int(r / n), i = int(r % n), s = order[size_t(i)];
      load_row(c.types().k, c.k_row(layer, hk, s),
               scratch.kv_f32.data() + hk * plane + size_t(i) * D, D);
      load_row(c.types().v, c.v_row(layer, hk, s),
               scratch.kv_f32.data() + (Hkv + hk) * plane + size_t(i) * D, D);
    }
  };
  // Short caches are converted on this thread: a hand-off would cost more.
  if (int64_t(Hkv) * n <= 4096) {
    convert(0, int64_t(Hkv) * n);
  } else {
    pool.parallel_for(int64_t(Hkv) * n, convert);
  }
  if (probs_last.data)
    for (int h = 0; h < n_head; ++h)
      std::fill_n(probs_last.data + int64_t(h) * probs_last.cols, pos0 + T, 0.0f);
  const int32_t* kpos = scratch.key_pos.data();
  // One work item per (query row, head).
  const int64_t items = T * n_head;
  pool.parallel_for(items, [&](int64_t b, int64_t e) {
    std::vector<float> scores(static_cast<size_t>(n));
    std::vector<int> seen(static_cast<size_t>(n));
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t it = b; it < e; ++it) {
      const int64_t t = it / n_head;
      const int h = int(it % n_head), hk = h / group;
      const int qp = int(pos0 + t);
      const float* qv = q.data + t * q.cols + h * D;
      const float* K = scratch.kv_f32.data() + hk * plane;
      const float* Vv = scratch.kv_f32.data() + (Hkv + hk) * plane;
      // Visible keys in position order (positions ascend, so stop past the query).
      int m = 0;
      float mx = -INFINITY;
      for (int i = 0; i < n && kpos[i] <= qp; ++i) {
        if (!rule.visible(kpos[i], qp)) continue;
        const float sc = dot_f32(qv, K + size_t(i) * D, D) * scale;
        seen[size_t(m)] = i;
        scores[size_t(m++)] = sc;
        mx = std::max(mx, sc);
      }
      double sum = 0;
      for (int j = 0; j < m; ++j) {
        scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
        sum += scores[size_t(j)];
      }
      const float inv = float(1.0 / sum);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = 0; j < m; ++j) {
        const float p = scores[size_t(j)] * inv;
        scores[size_t(j)] = p;
        axpy_f32(p, Vv + size_t(seen[size_t(j)]) * D, acc.data(), D);
      }
      std::memcpy(out.data + t * out.cols + h * D, acc.data(), size_t(D) * 4);
      if (t == T - 1 && probs_last.data) {
        float* row = probs_last.data + int64_t(h) * probs_last.cols;
        for (int j = 0; j < m; ++j) row[kpos[seen[size_t(j)]]] = scores[size_t(j)];
      }
    }
  });
  return Status::Ok();
}

}  // namespace kvscope::cpu
