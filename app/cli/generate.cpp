// generate.cpp — `kvscope generate`: runs the real engine step by step without a
// window and streams the text, or one JSON object per step with --json.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "engine/bootstrap/bootstrap.h"
#include "app/options/options.h"
#include "app/options/scheduler_options.h"
#include "app/options/speculative_options.h"
#include "app/cli/commands.h"
#include "app/cli/run_options.h"
#include "app/cli/json_writer.h"
#include "engine/beam_search.h"
#include "engine/printable.h"
#include "engine/scheduler.h"
#include "engine/session.h"

namespace kvscope::cli {
namespace {

std::string step_json(const StepTrace& tr) {
  JsonWriter j;
  j.begin_object();
  j.key("step").value(tr.step);
  j.key("pos").value(tr.pos);
  j.key("token_id").value(tr.token_id);
  j.key("text").value(tr.text);
  j.key("mode").value(cache_mode_name(tr.mode));
  j.key("flops").value(tr.flops);
  j.key("flops_total").value(tr.flops_total);
  j.key("kv_rows").value(tr.kv_rows);
  j.key("kv_rows_total").value(tr.kv_rows_total);
  j.key("kv_bytes").value(tr.kv_bytes);
  j.key("kv_transient_bytes").value(tr.kv_transient_bytes);
  // Per layer: attention window (0: none) and the positions its cache holds.
  j.key("kv_layers").begin_array();
  for (const KvLayerState& l : tr.kv_layers) {
    j.begin_object();
    j.key("window").value(l.window);
    j.key("held").begin_array();
    for (const KvRange& r : l.held) j.begin_array().value(r.begin).value(r.end).end_array();
    j.end_array();
    j.key("bytes").value(l.bytes);
    j.end_object();
  }
  j.end_array();
  j.key("seq_len").value(tr.seq_len);
  j.key("tokens_processed").value(tr.tokens_processed);
  if (tr.accepted >= 0) {  // this step verified a draft
    j.key("drafted").begin_array();
    for (int32_t d : tr.drafted) j.value(d);
    j.end_array();
    j.key("accepted").value(tr.accepted);
    j.key("rolled_back").value(tr.rolled_back);
    j.key("draft_flops").value(tr.draft_flops);
  }
  j.key("ms").value(tr.ms);
  if (tr.device_ms >= 0) j.key("device_ms").value(tr.device_ms);
  j.key("top").begin_array();
  for (size_t i = 0; i < tr.top.size() && i < 5; ++i) {
    j.begin_object();
    j.key("id").value(tr.top[i].id);
    j.key("text").value(tr.top[i].text);
    j.key("p").value(double(tr.top[i].p));
    j.key("logit").value(double(tr.top[i].logit));
    if (tr.top[i].raw_logit != tr.top[i].logit)
      j.key("raw_logit").value(double(tr.top[i].raw_logit));
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
}

// What the runs that do not go through a Session (beams, parallel samples) start from: the
// KV options, the model, its backend and the prompt's ids. The backend's notice is shown.
struct Opened {
  SessionConfig kv;  // the KV options as a session would take them
  std::shared_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::vector<int32_t> prompt;
};
Expected<Opened> open_model_run(const RunOptions& run) {
  Opened o;
  auto spec = prompt_from_options(run.prompt);
  if (!spec.ok()) return spec.error();
  KV_TRY(apply_kv_options(run.kv, o.kv));
  auto model = load_model(run.engine.model);
  if (!model.ok()) return model.error();
  o.model = std::move(*model);
  std::string note;
  auto be = make_backend(run.engine.backend, *o.model, run.engine.threads, &note);
  if (!be.ok()) return be.error();
  o.backend = std::move(*be);
  if (!note.empty()) notice(note);
  auto prompt = tokenize_prompt(*o.model, *spec);
  if (!prompt.ok()) return prompt.error();
  o.prompt = std::move(*prompt);
  return o;
}

// `generate --beams K`: beam search instead of the step-by-step session; prints the
// hypotheses best first (text, or one JSON object).
int run_beams(const RunOptions& run, const BeamConfig& bc, bool json) {
  auto opened = open_model_run(run);
  if (!opened.ok()) return fail(opened.error().message);
  const SessionConfig& probe = opened->kv;
  const std::shared_ptr<Model>& model = opened->model;
  const std::unique_ptr<Backend>& be = opened->backend;
  const std::vector<int32_t>* prompt = &opened->prompt;
  BeamConfig cfg = bc;
  cfg.kv_types = probe.kv_types;
  cfg.block_size = probe.kv_block;
  auto res = beam_search(*model, *be, *prompt, cfg);
  if (!res.ok()) return fail(res.error().message);
  const Tokenizer& tok = model->tokenizer();
  const auto text_of = [&](const std::vector<int32_t>& ids) {
    std::string bytes;
    for (int32_t id : ids) bytes += tok.token_bytes(id);
    Utf8Stream s;
    return s.push(bytes) + s.flush();
  };
  const BeamStats& st = res->stats;
  const uint64_t block_bytes = st.block_bytes;
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("beams").value(cfg.beams);
    j.key("length_penalty").value(double(cfg.length_penalty));
    j.key("hypotheses").begin_array();
    for (const Hypothesis& h : res->hypotheses) {
      j.begin_object();
      j.key("score").value(h.score);
      j.key("logprob").value(h.logprob);
      j.key("finished").value(h.finished);
      j.key("tokens").begin_array();
      for (int32_t id : h.tokens) j.value(id);
      j.end_array();
      j.key("text").value(text_of(h.tokens));
      j.end_object();
    }
    j.end_array();
    j.key("steps").value(st.steps);
    j.key("peak_blocks").value(st.peak_blocks);
    j.key("peak_unshared_blocks").value(st.peak_unshared_blocks);
    j.key("peak_kv_bytes").value(uint64_t(st.peak_blocks) * block_bytes);
    j.key("unshared_kv_bytes").value(uint64_t(st.peak_unshared_blocks) * block_bytes);
    j.key("cow_copies").value(st.cow_copies);
    j.key("pruned").value(st.pruned);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  int rank = 0;
  for (const Hypothesis& h : res->hypotheses)
    std::printf("[%d] score %.4f (log p %.3f, %zu tokens%s)%s\n\n", rank++, h.score, h.logprob,
                h.tokens.size(), h.finished ? ", ended" : "",
                printable_text(text_of(h.tokens)).c_str());
  std::printf("%d steps; KV blocks at the peak: %d shared, %d if each beam held its own\n",
              st.steps, st.peak_blocks, st.peak_unshared_blocks);
  return 0;
}

// `generate --n N`: N samples of the prompt, forked off its blocks once it is computed (the
// scheduler's parallel sampling); prints each sample (text, or one JSON object).
int run_samples(const RunOptions& run, int n, bool json) {
  SessionConfig checked;
  if (Status st = apply_kv_options(run.kv, checked); !st.ok()) return fail(st.message());
  if (checked.limits.window > 0 || checked.limits.on_full == ContextPolicy::Shift)
    return fail("--n: parallel samples run on the batch scheduler, which has no sink + window "
                "or context shift");
  auto sc = to_sampler_config(run.sampler);
  if (!sc.ok()) return fail(sc.error().message);
  auto opened = open_model_run(run);
  if (!opened.ok()) return fail(opened.error().message);
  const SessionConfig& probe = opened->kv;
  const std::shared_ptr<Model>& model = opened->model;
  const std::unique_ptr<Backend>& be = opened->backend;
  const std::vector<int32_t>* prompt = &opened->prompt;
  SchedulerConfig cfg;
  cfg.kv_types = probe.kv_types;
  cfg.block_size = probe.kv_block;
  cfg.context = probe.limits.n_ctx;
  cfg.max_seqs = n;
  auto sched = Scheduler::create(model, *be, cfg);
  if (!sched.ok()) return fail(sched.error().message);
  Scheduler& s = **sched;
  Request r;
  r.prompt = *prompt;
  r.max_tokens = run.max_tokens;
  r.sampler = *sc;
  r.n = n;
  r.stop_ids = run.stop.stop_ids;
  r.min_tokens = run.stop.min_tokens;
  auto id = s.add(std::move(r));
  if (!id.ok()) return fail(id.error().message);
  while (!s.idle()) {
    auto st = s.step();
    if (!st.ok()) return fail(st.error().message);
  }
  const SchedulerStats& t = s.stats();
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("samples").begin_array();
    for (int k = 0; k < n; ++k) {
      j.begin_object();
      j.key("sample").value(k);
      j.key("seed").value(sample_seed(sc->seed, k));
      j.key("stop_reason").value(stop_reason_name(s.stop_reason(*id + k)));
      j.key("tokens").begin_array();
      for (int32_t tk : s.generated(*id + k)) j.value(tk);
      j.end_array();
      j.key("text").value(s.text(*id + k));
      j.end_object();
    }
    j.end_array();
    j.key("prompt_tokens").value(int(prompt->size()));
    j.key("prefill_tokens").value(t.prefill_tokens);
    j.key("peak_kv_bytes").value(t.peak_kv_bytes);
    j.key("unshared_kv_bytes").value(t.unshared_kv_bytes);
    j.key("cow_copies").value(t.cow_copies);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  for (int k = 0; k < n; ++k)
    std::printf("[%d] (%s, %zu tokens)%s\n\n", k, stop_reason_name(s.stop_reason(*id + k)),
                s.generated(*id + k).size(), printable_text(s.text(*id + k)).c_str());
  std::printf("the prompt's %zu tokens computed once for %d samples; KV pool peak %.1f MiB, "
              "%.1f MiB if no block were shared; %d blocks copied on write\n",
              prompt->size(), n, double(t.peak_kv_bytes) / 1048576.0,
              double(t.unshared_kv_bytes) / 1048576.0, t.cow_copies);
  return 0;
}

}  // namespace

int run_generate(int argc, char** argv) {
  CLI::App app{"Run the model step by step without a window and stream what it writes.",
               "kvscope generate"};
  bool json = false;
  RunOptions run;
  add_run_options(app, run);
  app.add_option("--stop", run.stops, "Stop when the output contains this text (repeatable)");
  app.add_flag("--json", json, "One JSON object per step, then a summary line");
  SpeculativeOptions spec_opts;
  add_speculative_options(app, spec_opts);
  const std::string& speculative = spec_opts.spec;
  BeamConfig beams;
  add_beam_options(app, beams.beams, beams.length_penalty);
  int samples = 1;
  app.add_option("--n", samples,
                 "Samples of the prompt, forked off its KV blocks once it is computed")
      ->check(Range(1, 64));
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;
  if (samples > 1) {
    if (!speculative.empty() || app.count("--beams") > 0)
      return fail("--n: parallel samples neither speculate nor search beams");
    return run_samples(run, samples, json);
  }
  if (app.count("--beams") > 0) {
    if (!speculative.empty()) return fail("--beams: beam search does not speculate (drop --speculative)");
    beams.max_tokens = run.max_tokens;
    return run_beams(run, beams, json);
  }

  auto spec_cfg = to_speculative_config(spec_opts);
  if (!spec_cfg.ok()) return fail(spec_cfg.error().message);
  const SpeculativeConfig spec = *spec_cfg;
  auto opened = open_run(run);
  if (!opened.ok()) return fail(opened.error().message);
  Session& s = *opened->session;
  if (spec.kind == DraftKind::Model) {
    auto draft = load_model(spec.draft_path);
    if (!draft.ok()) return fail("draft: " + draft.error().message);
    auto be = make_backend(run.engine.backend, **draft, run.engine.threads, nullptr);
    if (!be.ok()) return fail("draft: " + be.error().message);
    if (Status st = s.set_speculation(spec, *draft, std::move(*be)); !st.ok())
      return fail(st.message());
  } else if (spec.kind != DraftKind::None) {
    if (Status st = s.set_speculation(spec); !st.ok()) return fail(st.message());
  }
  // The backend notice (e.g. no usable GPU) once the input is known to be good, so an
  // error stays a single line.
  if (!opened->notice.empty()) cli::notice(opened->notice);

  int generated = 0;
  while (!s.done()) {
    auto tr = s.step();
    if (!tr.ok()) return fail(tr.error().message);
    ++generated;
    if (json) {
      std::printf("%s\n", step_json(*tr).c_str());
    } else {
      // Generated text keeps its lines and tabs; control bytes become visible escapes.
      const std::string shown = printable_text(tr->emitted);
      std::fwrite(shown.data(), 1, shown.size(), stdout);
    }
    std::fflush(stdout);
  }
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("done").value(true);
    j.key("stop_reason").value(stop_reason_name(s.stop_reason()));
    j.key("tokens").value(generated);
    j.key("prompt_tokens").value(s.prompt_len());
    j.key("backend").value(s.backend().name());
    if (spec.kind != DraftKind::None) {
      const Session::SpeculationStats& st = s.speculation_stats();
      j.key("speculative").value(speculative_name(spec));
      j.key("drafted").value(st.drafted);
      j.key("accepted").value(st.accepted);
      j.key("verify_forwards").value(st.verify_forwards);
    }
    j.key("text").value(s.generated_text());
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

}  // namespace kvscope::cli
