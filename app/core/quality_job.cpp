// quality_job.cpp — a live cache comparison on its own thread (quality_job.h).
#include "app/core/quality_job.h"

#include "engine/bootstrap/bootstrap.h"
#include "engine/compare.h"

namespace kvscope::app {

QualityJob::~QualityJob() {
  stop();
  join();
}

void QualityJob::join() {
  if (worker_.joinable()) worker_.join();
}

void QualityJob::start(QualitySpec spec) {
  stop();
  join();
  stop_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap_ = QualitySnapshot{};
    snap_.running = true;
    snap_.steps = spec.steps;
  }
  worker_ = std::thread([this, spec = std::move(spec)]() mutable { run(std::move(spec)); });
}

void QualityJob::stop() {
  stop_ = true;
}

void QualityJob::wait() {
  join();
}

QualitySnapshot QualityJob::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snap_;
}

void QualityJob::run(QualitySpec spec) {
  auto finish = [&](std::string error) {
    std::lock_guard<std::mutex> lock(mu_);
    snap_.error = std::move(error);
    snap_.running = false;
  };
  auto model = load_model(spec.candidate.model_path);
  if (!model.ok()) return finish(model.error().message);
  SessionConfig cand_cfg, ref_cfg;
  cand_cfg.kv_types = spec.candidate.kv_types;
  cand_cfg.limits = spec.candidate.limits;
  cand_cfg.max_tokens = spec.steps;
  // The reference: f16, the model's full context; it follows the candidate's tokens and
  // never stops on its own before it.
  ref_cfg.max_tokens = spec.steps;
  ref_cfg.stop_at_eos = false;
  auto cand_be =
      make_backend(spec.candidate.backend, **model, spec.candidate.threads, nullptr);
  if (!cand_be.ok()) return finish(cand_be.error().message);
  auto ref_be = make_backend(spec.candidate.backend, **model, spec.candidate.threads, nullptr);
  if (!ref_be.ok()) return finish(ref_be.error().message);
  auto cand = Session::create(*model, std::move(cand_be.value()), cand_cfg);
  if (!cand.ok()) return finish(cand.error().message);
  auto ref = Session::create(*model, std::move(ref_be.value()), ref_cfg);
  if (!ref.ok()) return finish("reference: " + ref.error().message);
  const int model_ctx = (*model)->config().n_ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap_.candidate = describe_kv_config((*cand)->config(), model_ctx);
  }
  auto cmp = Comparison::create(std::move(cand.value()), std::move(ref.value()));
  if (!cmp.ok()) return finish(cmp.error().message);
  Comparison& c = **cmp;
  if (Status st = c.reset(spec.prompt); !st.ok()) return finish(st.message());
  const int need = c.candidate().prompt_len() + spec.steps;
  if (need > c.reference().context_limit())
    return finish("the prompt and " + std::to_string(spec.steps) + " steps need " +
                  std::to_string(need) + " positions but the reference's context holds " +
                  std::to_string(c.reference().context_limit()));
  double kl_sum = 0;
  while (!stop_ && !c.done()) {
    auto st = c.step();
    if (!st.ok()) return finish(st.error().message);
    QualityPoint p;
    p.step = st->step;
    p.kl = st->kl;
    p.top1_agree = st->top1_agree;
    p.cand_bytes = st->cand_kv_bytes;
    p.ref_bytes = st->ref_kv_bytes;
    kl_sum += p.kl;
    std::lock_guard<std::mutex> lock(mu_);
    snap_.points.push_back(p);
    snap_.mean_kl = kl_sum / double(snap_.points.size());
    snap_.agreements += p.top1_agree;
  }
  finish("");
}

}  // namespace kvscope::app
