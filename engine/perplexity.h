// perplexity.h — perplexity of a text under a session's cache configuration.
//
// The text's tokens go through the session one at a time, teacher-forced
// (Session::step_forced): the logits of each step score the next text token, so every
// token is predicted from exactly what the cache policy lets the model see — the whole
// prefix (full cache), a shifted context, or sinks + a window (StreamingLLM's setting).
// When the session stops because its context is full (the "stop" policy), scoring goes
// on in a fresh chunk that starts at the next token; the first token of the text (and
// of each chunk) is context only. perplexity = exp(mean negative log-likelihood).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/session.h"

namespace kvscope {

struct PerplexityResult {
  int tokens = 0;              // tokens of the text that were used
  int scored = 0;              // tokens whose probability was measured
  int chunks = 0;              // fresh starts (1 unless the context filled up)
  double nll_sum = 0;          // sum of -log p(token), nats
  uint64_t kv_bytes_max = 0;   // the most bytes the KV cache held at any step
  uint64_t kv_bytes_last = 0;  // bytes held after the last step
  double seconds = 0;
  std::vector<float> token_nll;  // [scored], in text order
  double mean_nll() const { return scored > 0 ? nll_sum / scored : 0.0; }
  double perplexity() const;
};

// Called after every scored token with (scored so far, tokens to score in all).
using PerplexityProgress = std::function<void(int, int)>;

// Scores tokens[1 .. n) (n = tokens.size(), or max_tokens when 0 < max_tokens < size).
// The session's sampler is not used; its stop conditions other than a full context
// should be off (stop_at_eos false, max_tokens at least n).
Expected<PerplexityResult> perplexity(Session& session, const std::vector<int32_t>& tokens,
                                      int max_tokens = 0, const PerplexityProgress& progress = {});

}  // namespace kvscope
