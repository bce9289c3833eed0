// beam_search.h — beam search over the paged KV pool.
//
// K beams advance together: each step is one forward_batch of every live beam's newest
// token. Every beam's continuations are scored by the sum of their tokens' log
// probabilities (log softmax of the model's logits); the K best that do not end the
// sequence become the next beams, and those that end it (an end-of-generation token, with
// stop_at_eos) are kept as finished hypotheses, scored sum / length^a (a: the length
// penalty; length: generated tokens). A new beam is a fork: a cache that adopts its
// parent's block table, so beams share every block they have in common and copy a shared
// block only when they write into it; a parent no new beam continues is released in the
// same step, and its private blocks go back to the pool. The search stops after
// max_tokens, or as soon as no live beam can beat the best finished hypothesis (its
// score can at most reach sum / max_len^a for a > 0, sum / len^a otherwise).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/backend.h"
#include "engine/model.h"

namespace kvscope {

struct BeamConfig {
  int beams = 4;                // K, 1..1024
  float length_penalty = 1.0f;  // a in score = sum log p / length^a
  int max_tokens = 32;          // generated tokens at most
  bool stop_at_eos = true;      // an end-of-generation token finishes a hypothesis
  KvTypes kv_types;
  int block_size = 16;
};

struct Hypothesis {
  std::vector<int32_t> tokens;  // generated, the end token included when it finished
  double logprob = 0;           // sum of the tokens' log probabilities
  double score = 0;             // logprob / length^a
  bool finished = false;        // ended by an end token (else by max_tokens)
};

struct BeamStats {
  int steps = 0;                 // forwards after the prompt's
  int peak_blocks = 0;           // the pool's used blocks at their peak
  int peak_unshared_blocks = 0;  // the beams' tables' blocks, a shared block once per table
  int cow_copies = 0;
  int pruned = 0;                // beams no new beam continued
  uint64_t block_bytes = 0;      // bytes of one block of the pool (kv_block_bytes)
};

struct BeamResult {
  std::vector<Hypothesis> hypotheses;  // best score first, at most K
  BeamStats stats;
};

// A hypothesis's score for a length penalty a.
double beam_score(double logprob, int length, float length_penalty);

// The `keep` most likely continuations of logits [V]: (token, log p) with log p from the
// log softmax in double, most likely first, ties to the lower id.
void beam_candidates(const float* logits, int V, int keep,
                     std::vector<std::pair<int32_t, double>>& out);

// Whether a live hypothesis of summed log-probability `logprob` after `length` tokens can
// still beat `best` (the best finished score) within max_tokens: its score can at most
// reach logprob / max_tokens^a for a > 0, logprob / length^a otherwise.
bool beam_can_beat(double logprob, int length, int max_tokens, float length_penalty, double best);

Expected<BeamResult> beam_search(const Model& model, Backend& backend,
                                 const std::vector<int32_t>& prompt, const BeamConfig& cfg);

}  // namespace kvscope
