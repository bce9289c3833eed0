// perplexity.cpp — teacher-forced perplexity through a session (see perplexity.h).
#include "engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace kvscope {
namespace {

// -log softmax(logits)[id], in double.
double neg_log_prob(const std::vector<float>& logits, int32_t id) {
  double mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, double(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  return mx + std::log(sum) - double(logits[size_t(id)]);
}

}  // namespace

double PerplexityResult::perplexity() const {
  return std::exp(mean_nll());
}

Expected<PerplexityResult> perplexity(Session& s, const std::vector<int32_t>& tokens,
                                      int max_tokens, const PerplexityProgress& progress) {
  int n = int(tokens.size());
  if (max_tokens > 0) n = std::min(n, max_tokens);
  if (n < 2) return make_error("perplexity: the text has ", n, " tokens; at least 2 are needed");
  const auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r;
  r.tokens = n;
  r.token_nll.reserve(size_t(n - 1));
  int next = 1;  // the token the next step scores
  while (next < n) {
    KV_TRY(s.reset_tokens({tokens[size_t(next - 1)]}));
    ++r.chunks;
    while (next < n && !s.done()) {
      auto tr = s.step_forced(tokens[size_t(next)]);
      if (!tr.ok()) return tr.error();
      const double nll = neg_log_prob(s.last_logits(), tokens[size_t(next)]);
      r.token_nll.push_back(float(nll));
      r.nll_sum += nll;
      ++r.scored;
      r.kv_bytes_max = std::max(r.kv_bytes_max, tr->kv_bytes);
      r.kv_bytes_last = tr->kv_bytes;
      ++next;
      if (progress) progress(r.scored, n - 1);
    }
    if (next < n && s.stop_reason() != StopReason::ContextFull)
      return make_error("perplexity: the session stopped (", stop_reason_name(s.stop_reason()),
                        ") after ", r.scored, " tokens; turn off its other stop conditions");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvscope
