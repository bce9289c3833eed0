// device_sampling.cpp — the host half of sampling on the device (see device_sampling.h).
#include "engine/device_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvscope {

namespace {
constexpr int kMaxDeviceCandidates = 256;  // kernels/sample.h kSampleMaxCandidates
constexpr int kCutCandidates = 64;         // looked at when only min-p / top-p cut
}  // namespace

int device_sample_candidates_needed(const SamplerConfig& cfg, int top_candidates, int V) {
  if (V <= 0) return 0;
  int need = std::clamp(top_candidates, 0, V);
  if (cfg.temperature > 0) {
    if (cfg.top_k > 0 && cfg.top_k < V)
      need = std::max(need, cfg.top_k);
    else if (cfg.top_p < 1.0f || cfg.min_p > 0)
      need = std::max(need, std::min(kCutCandidates, V));
    else
      return 0;  // every id is in the draw: the whole row is needed
  }
  const int n = std::min(need + 1, V);
  return n <= kMaxDeviceCandidates ? n : 0;
}

std::optional<DeviceSampleResult> device_sample_resolve(const DeviceCandidates& dc, int V,
                                                        const SamplerConfig& cfg,
                                                        int top_candidates) {
  const int n = int(dc.ids.size());
  if (n < 1 || n > V || dc.logits.size() != dc.ids.size() || dc.nan > 0 || !std::isfinite(dc.max))
    return std::nullopt;
  for (int32_t id : dc.ids)
    if (id < 0 || id >= V) return std::nullopt;
  // 1. inv, when the interval of sums settles it.
  const double lo = dc.sum - dc.sum_err, hi = dc.sum + dc.sum_err;
  if (!(lo > 0) || !std::isfinite(hi)) return std::nullopt;
  const float inv = float(1.0 / hi);
  if (inv != float(1.0 / lo)) return std::nullopt;
  const float temp = cfg.temperature > 0 ? cfg.temperature : 1.0f;
  std::vector<float> p(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    float v = softmax_term(dc.logits[size_t(j)], dc.max, temp);
    v *= inv;  // as softmax_with_temperature normalises
    p[size_t(j)] = v;
  }
  // 2. The CPU's order, verified for the entries above p_last.
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return p[size_t(a)] > p[size_t(b)] ||
           (p[size_t(a)] == p[size_t(b)] && dc.ids[size_t(a)] < dc.ids[size_t(b)]);
  });
  const float p_last = p[size_t(n) - 1];
  int M = n;
  if (n < V) {
    M = 0;
    while (M < n && p[size_t(order[size_t(M)])] > p_last) ++M;
  }
  const int top = std::clamp(top_candidates, 0, V);
  if (top > M) return std::nullopt;
  DeviceSampleResult r;
  for (int i = 0; i < top; ++i) {
    const int j = order[size_t(i)];
    r.ids.push_back(dc.ids[size_t(j)]);
    r.p.push_back(p[size_t(j)]);
    r.logits.push_back(dc.logits[size_t(j)]);
  }
  if (cfg.temperature <= 0) {  // 4. greedy
    r.kept = {dc.ids[0]};
    r.p_kept = {p[0]};
    return r;
  }
  // 3. sampler_kept_ids over the verified prefix.
  const size_t keep = cfg.top_k > 0 && cfg.top_k < V ? size_t(cfg.top_k) : size_t(V);
  std::vector<int> list(order.begin(), order.begin() + int64_t(std::min(keep, size_t(M))));
  bool complete = keep <= size_t(M);
  if (list.empty()) return std::nullopt;  // nothing verified to draw from
  const auto pl = [&](int j) { return p[size_t(j)]; };
  if (cfg.min_p > 0) {
    const float floor = cfg.min_p * pl(list[0]);
    if (!complete && p_last < floor) complete = true;  // every later id is below the floor
    if (complete)
      while (list.size() > 1 && pl(list.back()) < floor) list.pop_back();
  }
  if (cfg.top_p < 1.0f) {
    double cum = 0;
    size_t m = 0;
    bool reached = false;
    while (m < list.size()) {
      cum += pl(list[m]);
      ++m;
      if (cum >= cfg.top_p) {
        reached = true;
        break;
      }
    }
    if (reached) {
      list.resize(std::max<size_t>(1, m));
      complete = true;
    } else if (complete) {
      list.resize(std::max<size_t>(1, m));
    }
  }
  if (!complete) return std::nullopt;
  for (int j : list) {
    r.kept.push_back(dc.ids[size_t(j)]);
    r.p_kept.push_back(p[size_t(j)]);
  }
  return r;
}

}  // namespace kvscope
