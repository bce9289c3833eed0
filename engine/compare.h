// compare.h — a candidate cache configuration against a reference, in lockstep on the
// same tokens.
//
// Two sessions on the same model: the candidate (e.g. a q4_0 cache, a context shift,
// sink + window) samples its own tokens; the reference (by default an f16 cache over the
// full context) is teacher-forced with exactly those tokens (Session::step_forced), so at
// every step both predict the next token from the same sequence. Per step:
//   kl            KL(P_ref || P_cand) of the next-token distributions over the whole
//                 vocabulary (temperature 1), in nats, computed in double;
//   top1_agree    whether both rank the same token first;
//   max_attn_diff the largest |p_cand − p_ref| of the newest query's attention over
//                 every layer, head and position (a position the candidate no longer
//                 holds counts as probability 0 there).
// Identical configurations give KL 0, full agreement and attention difference 0.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/session.h"

namespace kvscope {

struct CompareStep {
  int step = 0;       // 1-based
  int32_t token = 0;  // the candidate's token, forced into the reference
  int32_t cand_top1 = 0, ref_top1 = 0;
  bool top1_agree = false;
  double kl = 0;            // nats
  float max_attn_diff = 0;  // at (layer, head, pos) below
  int attn_layer = 0, attn_head = 0, attn_pos = 0;  // pos: index in the token history
  uint64_t cand_kv_bytes = 0, ref_kv_bytes = 0;
  StepTrace candidate, reference;  // the two steps' full traces
};

struct CompareSummary {
  int steps = 0;
  double mean_kl = 0, max_kl = 0;
  int top1_agreements = 0;
  float max_attn_diff = 0;
  uint64_t cand_kv_bytes = 0, ref_kv_bytes = 0;  // after the last step
};

// KL(p || q) in nats of softmax(ref_logits) against softmax(cand_logits); both [V].
double kl_divergence_logits(const std::vector<float>& ref_logits,
                            const std::vector<float>& cand_logits);

class Comparison {
 public:
  // The sessions own their backends. Both must run on the same model.
  static Expected<std::unique_ptr<Comparison>> create(std::unique_ptr<Session> candidate,
                                                      std::unique_ptr<Session> reference);
  Status reset(const PromptSpec& prompt);
  // One step of each session. Errors: done, a backend failure, or the reference cannot
  // take another token (its context is full).
  Expected<CompareStep> step();
  bool done() const { return candidate_->done(); }
  const CompareSummary& summary() const { return summary_; }
  Session& candidate() { return *candidate_; }
  Session& reference() { return *reference_; }

 private:
  Comparison() = default;
  std::unique_ptr<Session> candidate_, reference_;
  CompareSummary summary_;
  double kl_sum_ = 0;
};

}  // namespace kvscope
