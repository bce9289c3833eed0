// compare.cpp — lockstep comparison of two cache configurations (see compare.h).
#include "engine/compare.h"

#include <algorithm>
#include <cmath>

#include "engine/sampler.h"

namespace kvscope {
namespace {

// log-softmax of logits in double.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double mx = -INFINITY;
  for (float l : logits) mx = std::max(mx, double(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return argmax_first(v);
}

}  // namespace

double kl_divergence_logits(const std::vector<float>& ref_logits,
                            const std::vector<float>& cand_logits) {
  if (ref_logits.size() != cand_logits.size() || ref_logits.empty()) return INFINITY;
  const std::vector<double> lp = log_softmax(ref_logits), lq = log_softmax(cand_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, kl);  // rounding can leave a tiny negative for equal inputs
}

Expected<std::unique_ptr<Comparison>> Comparison::create(std::unique_ptr<Session> candidate,
                                                         std::unique_ptr<Session> reference) {
  if (!candidate || !reference) return make_error("compare: two sessions are needed");
  if (&candidate->model() != &reference->model())
    return make_error("compare: the candidate and the reference must run the same model");
  std::unique_ptr<Comparison> c(new Comparison());
  c->candidate_ = std::move(candidate);
  c->reference_ = std::move(reference);
  return c;
}

Status Comparison::reset(const PromptSpec& prompt) {
  KV_TRY(candidate_->reset(prompt));
  KV_TRY(reference_->reset(prompt));
  summary_ = CompareSummary();
  kl_sum_ = 0;
  return Status::Ok();
}

Expected<CompareStep> Comparison::step() {
  if (candidate_->done())
    return make_error("compare: the candidate has stopped (",
                      stop_reason_name(candidate_->stop_reason()), "); reset with a prompt first");
  if (reference_->done())
    return make_error("compare: the reference stopped (",
                      stop_reason_name(reference_->stop_reason()),
                      ") before the candidate; give it a larger context or more tokens");
  auto cand = candidate_->step();
  if (!cand.ok()) return cand.error();
  auto ref = reference_->step_forced(cand->token_id);
  if (!ref.ok()) return ref.error();

  CompareStep cs;
  cs.step = cand->step;
  cs.token = cand->token_id;
  const auto& lc = candidate_->last_logits();
  const auto& lr = reference_->last_logits();
  cs.cand_top1 = argmax(lc);
  cs.ref_top1 = argmax(lr);
  cs.top1_agree = cs.cand_top1 == cs.ref_top1;
  cs.kl = kl_divergence_logits(lr, lc);
  // Attention rows are [L][H][n_attn] over each session's positions. A context shift
  // renumbers: a session's position j >= n_keep holds the token of history position
  // j + shifted_total, so the rows are compared by history position; a position only one
  // of them holds compares against 0.
  const int L = std::min(cand->n_layer, ref->n_layer), H = std::min(cand->n_head, ref->n_head);
  const int keep_c = candidate_->config().limits.n_keep;
  const int keep_r = reference_->config().limits.n_keep;
  const int n = std::max(cand->n_attn + cand->shifted_total, ref->n_attn + ref->shifted_total);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int p = 0; p < n; ++p) {
        auto at = [&](const StepTrace& t, int keep) {
          const int j = p < keep || t.shifted_total == 0 ? p
                        : p - t.shifted_total >= keep    ? p - t.shifted_total
                                                         : -1;
          return j >= 0 && j < t.n_attn ? t.attention[(size_t(l) * t.n_head + h) * t.n_attn + j]
                                        : 0.0f;
        };
        const float d = std::fabs(at(*cand, keep_c) - at(*ref, keep_r));
        if (d > cs.max_attn_diff) {
          cs.max_attn_diff = d;
          cs.attn_layer = l;
          cs.attn_head = h;
          cs.attn_pos = p;
        }
      }
  cs.cand_kv_bytes = cand->kv_bytes;
  cs.ref_kv_bytes = ref->kv_bytes;

  ++summary_.steps;
  kl_sum_ += cs.kl;
  summary_.mean_kl = kl_sum_ / summary_.steps;
  summary_.max_kl = std::max(summary_.max_kl, cs.kl);
  summary_.top1_agreements += cs.top1_agree ? 1 : 0;
  summary_.max_attn_diff = std::max(summary_.max_attn_diff, cs.max_attn_diff);
  summary_.cand_kv_bytes = cs.cand_kv_bytes;
  summary_.ref_kv_bytes = cs.ref_kv_bytes;
  cs.candidate = std::move(cand.value());
  cs.reference = std::move(ref.value());
  return cs;
}

}  // namespace kvscope
