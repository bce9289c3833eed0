// sampler.h — turns logits into the next token id.
//
// Greedy when temperature <= 0; otherwise temperature, then top-k, top-p and min-p
// filtering, then a draw from a seeded generator (same seed, same tokens).
//
// Penalties change the logits before that, from the tokens of the sequence so far
// (apply_penalties; the caller keeps the model's own logits):
//   - repetition (llama.cpp's convention): a token seen in the last `last_n` tokens has a
//     positive logit divided by `repeat`, a negative one multiplied by it;
//   - frequency and presence (OpenAI's convention): logit -= frequency * count + presence *
//     (count > 0), count = the token's occurrences in the same last `last_n` tokens;
//   - no-repeat n-gram: a token that would complete an n-gram already in the sequence gets
//     -inf (it cannot be chosen);
//   - logit bias: a fixed amount added to a token's logit (OpenAI's -100 .. 100).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvscope {

struct PenaltyConfig {
  float repeat = 1.0f;     // 1: off; > 1 discourages repeats
  float frequency = 0.0f;  // -2 .. 2; 0: off
  float presence = 0.0f;   // -2 .. 2; 0: off
  int last_n = 64;         // tokens the three above look back over (-1: the whole sequence)
  int no_repeat_ngram = 0;  // n > 0: no n-gram occurs twice
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit)
  // Whether any of them changes a logit.
  bool active() const {
    return repeat != 1.0f || frequency != 0.0f || presence != 0.0f || no_repeat_ngram > 0 ||
           !logit_bias.empty();
  }
  bool operator==(const PenaltyConfig&) const = default;
};

// One clear error naming the setting when a value is out of range (repeat in (0, 10],
// frequency and presence in [-2, 2], last_n >= -1, no_repeat_ngram in 0 .. 64, a bias id
// outside [0, n_vocab) or a bias outside [-100, 100]).
Status penalty_config_check(const PenaltyConfig& p, int n_vocab);

// Applies `p` to `logits` [V] in place, for a sequence whose tokens so far are seq[0, n).
void apply_penalties(const PenaltyConfig& p, const int32_t* seq, size_t n,
                     std::vector<float>& logits);

// The logits a sampler sees: `logits` after apply_penalties, then every id of `held_back`
// at -inf (the tokens a minimum length holds back).
void shape_logits(const PenaltyConfig& p, const int32_t* seq, size_t n,
                  const std::vector<int32_t>& held_back, std::vector<float>& logits);

struct SamplerConfig {
  float temperature = 0.0f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  PenaltyConfig penalties;
};

// The index std::max_element gives over v[0, n): the first of the largest values, where no
// NaN is ever the largest unless v[0] is one (then 0); -1 when n <= 0. Without
// max_element's branch on every value: a max over blocks of 16 that vectorizes, then the
// first block that holds it (a 49,152-value row in about 12 µs instead of 160).
int32_t argmax_first(const float* v, int64_t n);
inline int32_t argmax_first(const std::vector<float>& v) {
  return argmax_first(v.data(), int64_t(v.size()));
}

// One term of the softmax before it is normalised, exp((l - max) / temp) in float: what
// softmax_with_temperature computes for every logit (and the device sampler's host side,
// engine/device_sampling.h, for its candidates: the same bits).
inline float softmax_term(float l, float mx, float temp) { return std::exp((l - mx) / temp); }

// Probabilities over the whole vocabulary after temperature (temperature <= 0 uses 1): each
// softmax_term times float(1 / sum), the sum taken in double in index order.
std::vector<float> softmax_with_temperature(const std::vector<float>& logits, float temperature);
// The same into p (resized to logits.size(), its capacity reused).
void softmax_with_temperature(const std::vector<float>& logits, float temperature,
                              std::vector<float>& p);

// Every id of `p`, most probable first, ties by lower id (the order sampler_kept_ids
// cuts): a stable radix sort on the values' bits (two passes of up to 15 bits for
// probabilities in [0, 1], three of 11 otherwise), linear in the vocabulary. Any NaN
// comes first.
std::vector<int32_t> ids_by_probability(const std::vector<float>& p);
// The buffers of that sort, kept by a caller that sorts at every step (Sampler) so that a
// sampled step allocates nothing of the vocabulary's size.
struct SortScratch {
  std::vector<uint64_t> items;  // [2][n]: (key, id) pairs and their copy
  std::vector<uint32_t> count;  // per digit pass, its histogram
};
// ids_by_probability into `ids` (resized, its capacity reused).
void ids_by_probability(const std::vector<float>& p, std::vector<int32_t>& ids, SortScratch& s);

// The ids temperature sampling draws from, most probable first (ties: lower id): `p` (the
// softmax after temperature) cut by top-k, then min-p, then top-p.
std::vector<int32_t> sampler_kept_ids(const std::vector<float>& p, const SamplerConfig& cfg);
void sampler_kept_ids(const std::vector<float>& p, const SamplerConfig& cfg,
                      std::vector<int32_t>& ids, SortScratch& s);

class Sampler {
 public:
  explicit Sampler(SamplerConfig cfg = {}) { configure(cfg); }
  void configure(const SamplerConfig& cfg);  // also reseeds
  int32_t sample(const std::vector<float>& logits);
  // sample() past the softmax, for a caller that has it: p = softmax_with_temperature(
  // logits, config().temperature), temperature > 0. The same id sample(logits) returns.
  int32_t sample_softmax(const std::vector<float>& p);
  // The seeded draw of sample() over the kept ids (sampler_kept_ids), p_kept[i] the
  // probability of ids[i]: one number from the generator, the same id sample() returns.
  int32_t draw(const std::vector<int32_t>& ids, const std::vector<float>& p_kept);
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  // Reused from draw to draw: the softmax, the kept ids and their probabilities, the sort.
  std::vector<float> p_, p_kept_;
  std::vector<int32_t> ids_;
  SortScratch sort_;
};

}  // namespace kvscope
