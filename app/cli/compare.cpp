// compare.cpp — `kvscope compare`: a candidate KV cache configuration against a
// reference (f16, the model's full context unless --ref-* says otherwise), in lockstep
// on the candidate's own tokens teacher-forced into the reference (engine/compare.h).
// Prints one line per step (KL of the next-token distributions, top-1 agreement, the
// largest attention-probability difference, KV bytes) and a summary; --json prints one
// JSON object per step and a summary object.
#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>

#include "engine/bootstrap/bootstrap.h"
#include "app/options/options.h"
#include "app/cli/commands.h"
#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/options/sampler_options.h"
#include "app/options/prompt_options.h"
#include "app/cli/json_writer.h"
#include "engine/compare.h"

namespace kvscope::cli {
namespace {

std::string step_json(const CompareStep& s) {
  JsonWriter j;
  j.begin_object();
  j.key("step").value(s.step);
  j.key("token_id").value(s.token);
  j.key("text").value(s.candidate.text);
  j.key("kl").value(s.kl);
  j.key("top1_agree").value(s.top1_agree);
  j.key("cand_top1").value(s.cand_top1);
  j.key("ref_top1").value(s.ref_top1);
  j.key("max_attn_diff").value(double(s.max_attn_diff));
  j.key("attn_at").begin_object();
  j.key("layer").value(s.attn_layer);
  j.key("head").value(s.attn_head);
  j.key("pos").value(s.attn_pos);
  j.end_object();
  j.key("cand_kv_bytes").value(s.cand_kv_bytes);
  j.key("ref_kv_bytes").value(s.ref_kv_bytes);
  j.end_object();
  return j.str();
}

}  // namespace

int run_compare(int argc, char** argv) {
  CLI::App app{"Compare a KV cache configuration against a reference on the same tokens.",
               "kvscope compare"};
  PromptOptions prompt;
  add_prompt_options(app, prompt);
  KvOptions cand_kv, ref_kv;
  add_kv_options(app, cand_kv);
  add_kv_options(app, ref_kv, "ref-");
  int max_tokens = 64;
  bool json = false;
  add_max_tokens_option(app, max_tokens, "Steps to compare");
  SamplerOptions sampler;  // the candidate's; the reference is teacher-forced
  add_sampler_options(app, sampler);
  EngineArgs engine;  // both sessions: the same backend and threads
  add_engine_options(app, engine);
  app.add_flag("--json", json, "One JSON object per step, then a summary object");
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;

  auto spec = prompt_from_options(prompt);
  if (!spec.ok()) return fail(spec.error().message);
  SessionConfig cand_cfg, ref_cfg;
  if (Status st = apply_kv_options(cand_kv, cand_cfg); !st.ok()) return fail(st.message());
  if (Status st = apply_kv_options(ref_kv, ref_cfg, "ref-"); !st.ok()) return fail(st.message());
  cand_cfg.max_tokens = max_tokens;
  // The reference follows the candidate: it never stops on its own before it.
  ref_cfg.max_tokens = max_tokens;
  ref_cfg.stop_at_eos = false;

  auto model = load_model(engine.model.empty() ? default_model_path() : engine.model);
  if (!model.ok()) return fail(model.error().message);
  std::string notice;
  auto cand_be = make_backend(engine.backend, **model, engine.threads, &notice);
  if (!cand_be.ok()) return fail(cand_be.error().message);
  auto ref_be = make_backend(engine.backend, **model, engine.threads, nullptr);
  if (!ref_be.ok()) return fail(ref_be.error().message);
  auto cand = Session::create(*model, std::move(cand_be.value()), cand_cfg);
  if (!cand.ok()) return fail(cand.error().message);
  auto ref = Session::create(*model, std::move(ref_be.value()), ref_cfg);
  if (!ref.ok()) return fail("reference: " + ref.error().message);
  auto sc = to_sampler_config(sampler);
  if (!sc.ok()) return fail(sc.error().message);
  if (Status st = penalty_config_check(sc->penalties, (*model)->config().n_vocab); !st.ok())
    return fail(st.message());
  (*cand)->set_sampler(*sc);
  auto cmp = Comparison::create(std::move(cand.value()), std::move(ref.value()));
  if (!cmp.ok()) return fail(cmp.error().message);
  Comparison& c = **cmp;
  if (Status st = c.reset(*spec); !st.ok()) return fail(st.message());
  const int need = c.candidate().prompt_len() + max_tokens;
  if (need > c.reference().context_limit())
    return fail("compare: the prompt (" + std::to_string(c.candidate().prompt_len()) +
                " tokens) and " + std::to_string(max_tokens) + " steps need " +
                std::to_string(need) + " positions but the reference's context holds " +
                std::to_string(c.reference().context_limit()) + "; use fewer --max-tokens");
  if (!notice.empty()) cli::notice(notice);

  const int model_ctx = (*model)->config().n_ctx;
  if (!json)
    std::printf("candidate: %s\nreference: %s\n%5s  %-16s %12s  %-5s %10s  %12s %12s\n",
                describe_kv_config(c.candidate().config(), model_ctx).c_str(),
                describe_kv_config(c.reference().config(), model_ctx).c_str(), "step", "token",
                "KL (nats)", "top1", "max|dp|", "cand KV B", "ref KV B");
  while (!c.done()) {
    auto s = c.step();
    if (!s.ok()) return fail(s.error().message);
    if (json) {
      std::printf("%s\n", step_json(*s).c_str());
    } else {
      std::string tok = s->candidate.text;
      for (char& ch : tok)
        if (ch == '\n' || ch == '\t' || ch == '\r') ch = ' ';
      if (tok.size() > 14) tok = tok.substr(0, 14);
      std::printf("%5d  %-16s %12.3e  %-5s %10.3e  %12llu %12llu\n", s->step,
                  ("'" + tok + "'").c_str(), s->kl, s->top1_agree ? "same" : "DIFF",
                  double(s->max_attn_diff), (unsigned long long)s->cand_kv_bytes,
                  (unsigned long long)s->ref_kv_bytes);
    }
    std::fflush(stdout);
  }
  const CompareSummary& sum = c.summary();
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("done").value(true);
    j.key("steps").value(sum.steps);
    j.key("mean_kl").value(sum.mean_kl);
    j.key("max_kl").value(sum.max_kl);
    j.key("top1_agreement").value(sum.steps > 0 ? double(sum.top1_agreements) / sum.steps : 1.0);
    j.key("max_attn_diff").value(double(sum.max_attn_diff));
    j.key("cand_kv_bytes").value(sum.cand_kv_bytes);
    j.key("ref_kv_bytes").value(sum.ref_kv_bytes);
    j.key("candidate").value(describe_kv_config(c.candidate().config(), model_ctx));
    j.key("reference").value(describe_kv_config(c.reference().config(), model_ctx));
    j.key("text").value(c.candidate().generated_text());
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf(
        "steps %d, mean KL %.4e nats, max KL %.4e, top-1 agreement %d/%d, largest "
        "attention difference %.4e, KV bytes %llu (candidate) vs %llu (reference)\n",
        sum.steps, sum.mean_kl, sum.max_kl, sum.top1_agreements, sum.steps,
        double(sum.max_attn_diff), (unsigned long long)sum.cand_kv_bytes,
        (unsigned long long)sum.ref_kv_bytes);
  }
  return 0;
}

}  // namespace kvscope::cli
