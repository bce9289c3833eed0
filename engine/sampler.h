// sampler.h — turns logits into the next token id.
//
// Greedy when temperature <= 0; otherwise temperature, then top-k, top-p and min-p
// filtering, then a draw from a seeded generator (same seed, same tokens).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvscope {

struct SamplerConfig {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
};

// Probabilities over the whole vocabulary after temperature (temperature <= 0 uses 1).
std::vector<float> softmax_with_temperature(const std::vector<float>& logits, float temperature);

class Sampler {
 public:
  explicit Sampler(SamplerConfig cfg = {}) { configure(cfg); }
  void configure(const SamplerConfig& cfg);  // also reseeds
  int32_t sample(const std::vector<float>& logits);
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
};

}  // namespace kvscope
