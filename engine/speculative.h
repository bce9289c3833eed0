// speculative.h — speculative decoding: a drafter proposes k tokens, the target model
// checks them all in one forward pass of k + 1 positions, and the rows of the rejected
// ones are rolled back out of the KV cache.
//
// Drafters:
//   - ngram: prompt lookup. The longest suffix of the sequence (up to max_ngram tokens)
//     that occurred earlier proposes what followed its latest earlier occurrence. No model.
//   - early-exit:L: the target's own first L layers, then its final norm and LM head, with a
//     cache of their own.
//   - draft:PATH: another GGUF with the same vocabulary, with a cache of its own.
// Acceptance (speculative_accept):
//   - greedy: the longest prefix of the draft equal to the target's argmax at each
//     position, then the target's argmax after it — so the tokens are exactly plain greedy's;
//   - sampling: Leviathan et al.'s rule. Draft token x (drawn from q) is kept with
//     probability min(1, p(x) / q(x)); at the first rejection the token is drawn from
//     max(0, p - q) renormalized; when all k are kept, one more is drawn from p. The tokens
//     are then distributed exactly as the target sampler's. p and q are the sampler's
//     distributions (sampling_distribution: temperature, top-k, top-p, min-p); a lookup
//     draft is a token with q = 1.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/sampler.h"

namespace kvscope {

enum class DraftKind { None, Ngram, EarlyExit, Model };

// Speculative sampling draws from a generator of its own, seeded with the sampler's seed
// xor this (a Session's, and each scheduled sequence's).
inline constexpr uint64_t kSpeculationSeed = 0x5bd1e9955bd1e995ull;

struct SpeculativeConfig {
  DraftKind kind = DraftKind::None;
  int layers = 0;          // early-exit: the target's first `layers` layers
  std::string draft_path;  // draft: the draft model's file
  int draft_max = 4;       // k: tokens drafted per target forward (1..15)
};
// "ngram", "early-exit:L" or "draft:PATH"; an unknown form is an Error naming the choices.
Expected<SpeculativeConfig> speculative_parse(const std::string& text);
// "ngram", "early-exit:3", "draft:/path/model.gguf".
std::string speculative_name(const SpeculativeConfig& c);

// The distribution the sampler draws from for these logits: softmax after temperature,
// restricted to what top-k, top-p and min-p keep, renormalized; greedy (temperature <= 0):
// all mass on the argmax (lowest id on ties).
std::vector<float> sampling_distribution(const std::vector<float>& logits, const SamplerConfig& s);
// A draw from a distribution [V] with `rng` (53 random bits, like Sampler).
int32_t draw(const std::vector<float>& p, std::mt19937_64& rng);

struct Verdict {
  int accepted = 0;  // draft tokens kept
  int32_t next = 0;  // the token after them: the correction, or one more from p[k]
};
// `draft` [k], q [k] (each [V], or empty for a token the drafter proposed with
// probability 1), p [k + 1] (each [V]): the target's distributions after the sequence and
// after each draft prefix. Greedy: argmax comparison; else Leviathan's rule with `rng`.
Verdict speculative_accept(const std::vector<int32_t>& draft,
                           const std::vector<std::vector<float>>& q,
                           const std::vector<std::vector<float>>& p, bool greedy,
                           std::mt19937_64& rng);

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Proposes up to k tokens to follow `seq` (q: for each, the distribution it was drawn
  // from, or empty for a lookup). Fewer (or none) when it has nothing to offer.
  virtual Status propose(const std::vector<int32_t>& seq, int k, const SamplerConfig& sampler,
                         std::mt19937_64& rng, std::vector<int32_t>& draft,
                         std::vector<std::vector<float>>& q) = 0;
  // Multiply-adds x 2 of the drafter's forwards since it was made (0 without a model).
  virtual uint64_t flops() const { return 0; }
};

std::unique_ptr<Drafter> make_ngram_drafter(int max_ngram = 3);
// A model drafter: `model` run through `backend` (borrowed: the session's, for an early
// exit) with a KV cache of its first `layers` layers (0: all) over a pool of its own that
// holds `context` positions. It keeps the sequence it has seen and, at each proposal,
// computes only what changed since (its cache cut back to the common prefix).
Expected<std::unique_ptr<Drafter>> make_model_drafter(std::shared_ptr<const Model> model,
                                                      Backend* backend, int layers, KvTypes types,
                                                      int context);
// The same, owning its backend (a draft model of its own).
Expected<std::unique_ptr<Drafter>> make_model_drafter(std::shared_ptr<const Model> model,
                                                      std::unique_ptr<Backend> backend,
                                                      KvTypes types, int context);

// An error unless the draft's vocabulary is the target's, token for token.
Status check_same_vocabulary(const Model& target, const Model& draft);

}  // namespace kvscope
