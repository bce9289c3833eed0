// sampler.cpp — greedy and seeded stochastic sampling (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <unordered_map>

namespace kvscope {
namespace {

// Up to this top-k, the kept ids come from a partial sort (about V·log k comparisons);
// past it, and without top-k, from ids_by_probability (a few linear passes): a full
// comparison sort of a 49,152-token vocabulary took as long as the forward pass it
// samples from.
constexpr int kPartialSortMax = 256;

// The shortest decimal that reads back as v ("2.5", not "2.500000").
std::string num(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

Status penalty_config_check(const PenaltyConfig& p, int n_vocab) {
  if (!(p.repeat > 0.0f && p.repeat <= 10.0f))
    return make_error("repeat-penalty: ", num(p.repeat), " is outside (0, 10] (1 = off)");
  if (!(p.frequency >= -2.0f && p.frequency <= 2.0f))
    return make_error("frequency-penalty: ", num(p.frequency), " is outside [-2, 2]");
  if (!(p.presence >= -2.0f && p.presence <= 2.0f))
    return make_error("presence-penalty: ", num(p.presence), " is outside [-2, 2]");
  if (p.last_n < -1)
    return make_error("repeat-last-n: ", p.last_n, " is below -1 (-1 = the whole sequence)");
  if (p.no_repeat_ngram < 0 || p.no_repeat_ngram > 64)
    return make_error("no-repeat-ngram: ", p.no_repeat_ngram, " is outside 0..64 (0 = off)");
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= n_vocab)
      return make_error("logit-bias: token id ", id, " is outside the vocabulary [0, ", n_vocab,
                        ")");
    if (!(bias >= -100.0f && bias <= 100.0f))
      return make_error("logit-bias: ", num(bias), " for token ", id, " is outside [-100, 100]");
  }
  return Status::Ok();
}

void apply_penalties(const PenaltyConfig& p, const int32_t* seq, size_t n,
                     std::vector<float>& logits) {
  const int64_t V = int64_t(logits.size());
  const auto in_vocab = [&](int32_t id) { return id >= 0 && id < V; };
  if (p.repeat != 1.0f || p.frequency != 0.0f || p.presence != 0.0f) {
    const size_t from = p.last_n < 0 ? 0 : n - std::min(n, size_t(p.last_n));
    std::unordered_map<int32_t, int> count;
    for (size_t i = from; i < n; ++i) ++count[seq[i]];
    for (const auto& [id, c] : count) {
      if (!in_vocab(id)) continue;
      float& l = logits[size_t(id)];
      if (p.repeat != 1.0f) l = l > 0 ? l / p.repeat : l * p.repeat;
      l -= p.frequency * float(c) + p.presence;
    }
  }
  const int g = p.no_repeat_ngram;
  if (g > 0 && n + 1 >= size_t(g)) {
    // The last g - 1 tokens followed by x would be an n-gram seen before: ban each such x.
    const int32_t* tail = seq + (n - size_t(g - 1));
    for (size_t i = 0; i + size_t(g) <= n; ++i)
      if (std::equal(tail, tail + (g - 1), seq + i) && in_vocab(seq[i + size_t(g - 1)]))
        logits[size_t(seq[i + size_t(g - 1)])] = -std::numeric_limits<float>::infinity();
  }
  for (const auto& [id, bias] : p.logit_bias)
    if (in_vocab(id)) logits[size_t(id)] += bias;
}

void shape_logits(const PenaltyConfig& p, const int32_t* seq, size_t n,
                  const std::vector<int32_t>& held_back, std::vector<float>& logits) {
  apply_penalties(p, seq, n, logits);
  for (int32_t id : held_back)
    if (id >= 0 && size_t(id) < logits.size())
      logits[size_t(id)] = -std::numeric_limits<float>::infinity();
}

int32_t argmax_first(const float* v, int64_t n) {
  if (n <= 0) return -1;
  if (std::isnan(v[0])) return 0;  // nothing compares above it
  // The largest value: NaNs never pass the comparison, so they are skipped as in
  // max_element; 16 independent lanes, which the compiler turns into vector maxima.
  constexpr int L = 16;
  float m[L];
  for (int j = 0; j < L; ++j) m[j] = -INFINITY;
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) m[j] = v[i + j] > m[j] ? v[i + j] : m[j];
  float mx = v[0];
  for (int j = 0; j < L; ++j) mx = m[j] > mx ? m[j] : mx;
  for (; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
  // Its first index (+0 and -0 compare equal, as they do for max_element, which keeps
  // the first of them).
  int64_t k = 0;
  for (; k + L <= n; k += L) {
    int any = 0;
    for (int j = 0; j < L; ++j) any |= v[k + j] == mx;
    if (any)
      for (int j = 0; j < L; ++j)
        if (v[k + j] == mx) return int32_t(k + j);
  }
  for (; k < n; ++k)
    if (v[k] == mx) return int32_t(k);
  return 0;  // not reached: mx is one of the values
}

std::vector<float> softmax_with_temperature(const std::vector<float>& logits, float temperature) {
  std::vector<float> p;
  softmax_with_temperature(logits, temperature, p);
  return p;
}

void softmax_with_temperature(const std::vector<float>& logits, float temperature,
                              std::vector<float>& p) {
  const float temp = temperature > 0 ? temperature : 1.0f;
  p.resize(logits.size());
  if (logits.empty()) return;
  const float mx = logits[size_t(argmax_first(logits))];
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = softmax_term(logits[i], mx, temp);
    sum += p[i];
  }
  const float inv = float(1.0 / sum);
  for (float& v : p) v *= inv;
}

std::vector<int32_t> ids_by_probability(const std::vector<float>& p) {
  std::vector<int32_t> ids;
  SortScratch s;
  ids_by_probability(p, ids, s);
  return ids;
}

void ids_by_probability(const std::vector<float>& p, std::vector<int32_t>& ids, SortScratch& s) {
  const size_t n = p.size();
  ids.resize(n);
  if (n == 0) return;
  // Items key << 32 | id, where the key's unsigned order is the floats' order reversed
  // (largest first): a float's bits with the sign flipped, or all of them flipped for a
  // negative one; -0 as +0 (the comparison treats them as equal).
  s.items.resize(2 * n);
  uint64_t* items = s.items.data();
  uint64_t* other = items + n;
  uint32_t differ = 0;  // the key bits that are not the same in every item
  uint32_t first = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &p[i], 4);
    if (b == 0x80000000u) b = 0;
    const uint32_t key = (b & 0x80000000u) ? b : ~(b | 0x80000000u);
    if (i == 0) first = key;
    differ |= key ^ first;
    items[i] = uint64_t(key) << 32 | uint32_t(i);
  }
  // Digits over the bits that differ only: probabilities in [0, 1] share the keys' top two
  // bits, so two passes of up to 15 bits do; anything else takes three of 11.
  const int width = differ ? 32 - __builtin_clz(differ) : 0;
  const int passes = width <= 30 ? 2 : 3;
  const int bits = width <= 30 ? (width + 1) / 2 : 11;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<uint32_t>& count = s.count;
  count.assign(size_t(passes) << bits, 0);
  for (size_t i = 0; i < n; ++i)
    for (int d = 0; d < passes; ++d)
      ++count[(size_t(d) << bits) + ((items[i] >> (32 + d * bits)) & mask)];
  // A stable sort by each digit, the lowest first: equal keys keep the ids' ascending
  // order.
  for (int d = 0; d < passes && width > 0; ++d) {
    uint32_t* c = count.data() + (size_t(d) << bits);
    const int shift = 32 + d * bits;
    uint32_t at = 0;
    for (uint32_t v = 0; v <= mask; ++v) {
      const uint32_t k = c[v];
      c[v] = at;
      at += k;
    }
    for (size_t i = 0; i < n; ++i) other[c[(items[i] >> shift) & mask]++] = items[i];
    std::swap(items, other);
  }
  for (size_t i = 0; i < n; ++i) ids[i] = int32_t(uint32_t(items[i]));
}

std::vector<int32_t> sampler_kept_ids(const std::vector<float>& p, const SamplerConfig& cfg) {
  std::vector<int32_t> ids;
  SortScratch s;
  sampler_kept_ids(p, cfg, ids, s);
  return ids;
}

void sampler_kept_ids(const std::vector<float>& p, const SamplerConfig& cfg,
                      std::vector<int32_t>& ids, SortScratch& s) {
  // Candidates in descending probability (ties by id, so the order is deterministic).
  auto by_p = [&](int32_t a, int32_t b) {
    return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
  };
  size_t keep = p.size();
  if (cfg.top_k > 0 && size_t(cfg.top_k) < keep && cfg.top_k <= kPartialSortMax) {
    keep = size_t(cfg.top_k);
    ids.resize(p.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + int64_t(keep), ids.end(), by_p);
  } else {
    if (cfg.top_k > 0) keep = std::min(keep, size_t(cfg.top_k));
    ids_by_probability(p, ids, s);
  }
  ids.resize(keep);
  if (ids.empty()) return;
  if (cfg.min_p > 0) {
    const float floor = cfg.min_p * p[size_t(ids[0])];
    while (ids.size() > 1 && p[size_t(ids.back())] < floor) ids.pop_back();
  }
  if (cfg.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < ids.size()) {
      cum += p[size_t(ids[n])];
      ++n;
      if (cum >= cfg.top_p) break;
    }
    ids.resize(std::max<size_t>(1, n));
  }
}

void Sampler::configure(const SamplerConfig& cfg) {
  cfg_ = cfg;
  rng_.seed(cfg.seed);
}

int32_t Sampler::sample(const std::vector<float>& logits) {
  if (logits.empty()) return -1;
  if (cfg_.temperature <= 0) {
    // Greedy: argmax, lowest id on ties.
    return argmax_first(logits);
  }
  softmax_with_temperature(logits, cfg_.temperature, p_);
  return sample_softmax(p_);
}

int32_t Sampler::sample_softmax(const std::vector<float>& p) {
  if (p.empty()) return -1;
  sampler_kept_ids(p, cfg_, ids_, sort_);
  p_kept_.resize(ids_.size());
  for (size_t i = 0; i < ids_.size(); ++i) p_kept_[i] = p[size_t(ids_[i])];
  return draw(ids_, p_kept_);
}

int32_t Sampler::draw(const std::vector<int32_t>& ids, const std::vector<float>& p_kept) {
  if (ids.empty() || p_kept.size() != ids.size()) return -1;
  double total = 0;
  for (float v : p_kept) total += v;
  // A uniform draw in [0, total) from 53 random bits: reproducible across platforms.
  const double u = double(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double cum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cum += p_kept[i];
    if (u < cum) return ids[i];
  }
  return ids.back();
}

}  // namespace kvscope
