// sampler.cpp — greedy and seeded stochastic sampling (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvscope {

std::vector<float> softmax_with_temperature(const std::vector<float>& logits, float temperature) {
  const float temp = temperature > 0 ? temperature : 1.0f;
  std::vector<float> p(logits.size());
  if (logits.empty()) return p;
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - mx) / temp);
    sum += p[i];
  }
  const float inv = float(1.0 / sum);
  for (float& v : p) v *= inv;
  return p;
}

void Sampler::configure(const SamplerConfig& cfg) {
  cfg_ = cfg;
  rng_.seed(cfg.seed);
}

int32_t Sampler::sample(const std::vector<float>& logits) {
  if (logits.empty()) return -1;
  if (cfg_.temperature <= 0) {
    // Greedy: argmax, lowest id on ties.
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<float> p = softmax_with_temperature(logits, cfg_.temperature);
  std::vector<int32_t> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  // Candidates in descending probability (ties by id, so the order is deterministic).
  auto by_p = [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b); };
  size_t keep = ids.size();
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < keep) {
    keep = size_t(cfg_.top_k);
    std::partial_sort(ids.begin(), ids.begin() + int64_t(keep), ids.end(), by_p);
  } else {
    std::sort(ids.begin(), ids.end(), by_p);
  }
  ids.resize(keep);
  if (cfg_.min_p > 0) {
    const float floor = cfg_.min_p * p[size_t(ids[0])];
    while (ids.size() > 1 && p[size_t(ids.back())] < floor) ids.pop_back();
  }
  if (cfg_.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < ids.size()) {
      cum += p[size_t(ids[n])];
      ++n;
      if (cum >= cfg_.top_p) break;
    }
    ids.resize(std::max<size_t>(1, n));
  }
  double total = 0;
  for (int32_t id : ids) total += p[size_t(id)];
  // A uniform draw in [0, total) from 53 random bits: reproducible across platforms.
  const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double cum = 0;
  for (int32_t id : ids) {
    cum += p[size_t(id)];
    if (u < cum) return id;
  }
  return ids.back();
}

}  // namespace kvscope
