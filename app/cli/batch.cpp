// batch.cpp — `kvscope batch`: many prompts served at once from one pool of KV blocks
// by the continuous-batching scheduler (engine/scheduler.h). Prints each sequence's text
// as it finishes, or with --json one line per step and a summary line.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/cli/commands.h"
#include "app/cli/json_writer.h"
#include "app/core/serving_run.h"
#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/options/options.h"
#include "app/options/sampler_options.h"
#include "app/options/scheduler_options.h"
#include "app/options/speculative_options.h"
#include "engine/bootstrap/bootstrap.h"
#include "engine/forward.h"
#include "engine/scheduler.h"

namespace kvscope::cli {
namespace {

// One prompt per line; "\n" in a line is a newline, "\\" a backslash. Blank lines are
// skipped.
Expected<std::vector<std::string>> read_prompts_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("--prompts-file: cannot read ", path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string p;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == 'n' || line[i + 1] == '\\')) {
        p += line[i + 1] == 'n' ? '\n' : '\\';
        ++i;
      } else {
        p += line[i];
      }
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) return make_error("--prompts-file: ", path, " has no prompts");
  return out;
}

// Every regular file of the folder, in name order, one prompt each.
Expected<std::vector<std::string>> read_prompts_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file()) files.push_back(it->path());
  if (ec) return make_error("--prompts-dir: cannot read ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (!text.empty()) out.push_back(std::move(text));
  }
  if (out.empty()) return make_error("--prompts-dir: ", dir, " has no prompt files");
  return out;
}

// `samples` per prompt: sequence id = prompt x samples + sample.
std::string step_json(const BatchStep& st, int samples) {
  JsonWriter j;
  j.begin_object();
  j.key("step").value(st.step);
  j.key("sequences").begin_array();
  for (const StepRow& r : st.rows) {
    j.begin_object();
    j.key("seq").value(r.seq);
    if (samples > 1) {
      j.key("prompt").value(r.seq / samples);
      j.key("sample").value(r.seq % samples);
    }
    j.key("token_id").value(r.token_id);
    j.key("pos").value(r.token_id >= 0 ? r.pos : r.pos0 + r.tokens - 1);
    j.key("is_prompt").value(r.is_prompt);
    j.key("tokens").value(r.tokens);
    j.key("blocks").value(r.blocks);
    j.key("table").begin_array();
    for (int32_t b : r.table) j.value(b);
    j.end_array();
    if (!r.tables.empty()) {  // one table per layer group (a model with windows)
      j.key("tables").begin_array();
      for (const auto& t : r.tables) {
        j.begin_array();
        for (int32_t b : t) j.value(b);
        j.end_array();
      }
      j.end_array();
    }
    if (r.token_id >= 0) j.key("text").value(r.text);
    if (r.tokens_out.size() > 1) {  // a verified draft emits several
      j.key("tokens_out").begin_array();
      for (int32_t t : r.tokens_out) j.value(t);
      j.end_array();
    }
    if (!r.drafted.empty()) {
      j.key("drafted").value(int(r.drafted.size()));
      j.key("accepted").value(r.accepted);
    }
    j.end_object();
  }
  j.end_array();
  j.key("pool").begin_object();
  j.key("used").value(st.pool.counts.used);
  j.key("free").value(st.pool.counts.free);
  j.key("cached").value(st.pool.counts.cached);
  j.key("total").value(st.pool.counts.total);
  j.key("block_size").value(st.pool.block_size);
  j.key("held_positions").value(st.pool.held_positions);
  j.end_object();
  j.key("events").begin_array();
  for (const SchedEvent& e : st.events) {
    j.begin_object();
    j.key("kind").value(event_kind_name(e.kind));
    j.key("seq").value(e.seq);
    j.key("n").value(e.n);
    if (!e.detail.empty()) j.key("detail").value(e.detail);
    j.end_object();
  }
  j.end_array();
  j.key("batch_tokens").value(st.batch_tokens);
  j.key("running").value(st.running);
  j.key("waiting").value(st.waiting);
  j.key("ms").value(st.ms);
  j.end_object();
  return j.str();
}

// A beam search request's hypotheses, best first.
void beams_json(JsonWriter& j, const Scheduler& s, const std::vector<int>& firsts) {
  j.key("beams").begin_array();
  for (size_t i = 0; i < firsts.size(); ++i) {
    j.begin_object();
    j.key("prompt").value(int(i));
    j.key("hypotheses").begin_array();
    for (const BeamHypothesis& h : s.beam_hypotheses(firsts[i])) {
      j.begin_object();
      j.key("seq").value(h.seq);
      j.key("score").value(h.score);
      j.key("logprob").value(h.logprob);
      j.key("finished").value(h.finished);
      j.key("tokens").begin_array();
      for (int32_t t : s.generated(h.seq)) j.value(t);
      j.end_array();
      j.key("text").value(s.text(h.seq));
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
}

std::string summary_json(const Scheduler& s, int requests, const std::vector<int>& beam_firsts) {
  const SchedulerStats& t = s.stats();
  JsonWriter j;
  j.begin_object();
  j.key("summary").value(true);
  j.key("requests").value(requests);
  j.key("finished").value(t.finished);
  j.key("steps").value(t.steps);
  j.key("block_size").value(s.config().block_size);
  j.key("pool_blocks").value(s.pool().n_blocks());
  j.key("layer_groups").value(s.layer_groups().count());
  j.key("block_bytes").value(kv_block_bytes(s.pool().config()));
  j.key("peak_kv_bytes").value(t.peak_kv_bytes);
  j.key("unshared_kv_bytes").value(t.unshared_kv_bytes);
  j.key("contiguous_kv_bytes").value(t.contiguous_kv_bytes);
  j.key("slot_utilization").value(t.slot_utilization);
  j.key("contiguous_slot_utilization").value(t.contiguous_utilization);
  j.key("internal_fragmentation").value(t.internal_fragmentation);
  j.key("prefix_hit_tokens").value(t.prefix_hit_tokens);
  j.key("prefill_tokens").value(t.prefill_tokens);
  j.key("decode_tokens").value(t.decode_tokens);
  j.key("preemptions").value(t.preemptions);
  j.key("cow_copies").value(t.cow_copies);
  j.key("ttft_hit_ms").value(t.ttft_hit_ms);
  j.key("ttft_hits").value(t.ttft_hits);
  j.key("ttft_miss_ms").value(t.ttft_miss_ms);
  j.key("ttft_misses").value(t.ttft_misses);
  j.key("ms").value(t.ms);
  j.key("decode_tok_s").value(t.ms > 0 ? double(t.decode_tokens) * 1000.0 / t.ms : 0.0);
  if (s.config().speculation.kind != DraftKind::None) {
    j.key("speculative").value(speculative_name(s.config().speculation));
    j.key("drafted").value(t.drafted);
    j.key("accepted").value(t.accepted);
    j.key("acceptance").value(t.drafted ? double(t.accepted) / double(t.drafted) : 0.0);
    j.key("verify_rows").value(t.verify_rows);
    j.key("tokens_per_target_forward")
        .value(t.decode_rows ? double(t.decode_row_tokens) / double(t.decode_rows) : 0.0);
  }
  if (!beam_firsts.empty()) beams_json(j, s, beam_firsts);
  j.end_object();
  return j.str();
}

}  // namespace

int run_batch(int argc, char** argv) {
  CLI::App app{"Serve many prompts at once from one pool of KV blocks (continuous batching).",
               "kvscope batch"};
  std::string prompts_file, prompts_dir, arrival = "all";
  bool json = false, chat = false;
  int max_tokens = 64, samples = 1, beams = 0;
  float length_penalty = 1.0f;
  SamplerOptions sampler;
  StopOptions stop;
  EngineArgs engine;
  SchedulerOptions sched_opts;
  SpeculativeOptions spec_opts;
  auto* file = app.add_option("--prompts-file", prompts_file,
                              "One prompt per line (\\n in a line is a newline)");
  auto* dir = app.add_option("--prompts-dir", prompts_dir, "One prompt per file, in name order");
  file->excludes(dir);
  app.add_flag("--chat", chat, "Wrap each prompt as a user turn in the model's chat template");
  add_arrival_option(app, arrival);
  add_max_tokens_option(app, max_tokens, "Tokens to generate per prompt");
  add_sampler_options(app, sampler);
  add_stop_options(app, stop);
  add_engine_options(app, engine);
  add_scheduler_options(app, sched_opts);
  add_samples_option(app, samples);
  const BeamOptionRefs beam_opts = add_beam_options(app, beams, length_penalty);
  add_speculative_options(app, spec_opts, /*draft_model=*/true);
  app.add_flag("--json", json, "One JSON object per step, then a summary line");
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;
  if (prompts_file.empty() && prompts_dir.empty())
    return fail("batch: give the prompts with --prompts-file F or --prompts-dir D");

  auto prompts = prompts_file.empty() ? read_prompts_dir(prompts_dir) : read_prompts_file(prompts_file);
  if (!prompts.ok()) return fail(prompts.error().message);
  auto sampler_cfg = to_sampler_config(sampler);
  if (!sampler_cfg.ok()) return fail(sampler_cfg.error().message);
  const SamplerConfig sc = *sampler_cfg;
  auto spec = to_speculative_config(spec_opts);
  if (!spec.ok()) return fail(spec.error().message);
  if (beam_opts.length_penalty->count() > 0 && beams == 0)
    return fail("--length-penalty: it scores beams; give --beams K");
  if (beams > 0 && samples > 1) return fail("--beams: beam search draws no samples (drop --n)");
  if (beams > 0 && spec->kind != DraftKind::None)
    return fail("--beams: beam search does not speculate (drop --speculative)");
  if (beams > 0 && (sc.penalties.active() || stop.min_tokens > 0 || !stop.stop_ids.empty()))
    return fail("--beams: beam search scores the model's own log-probabilities (drop the "
                "penalties, --min-tokens and --stop-id)");
  auto arrivals = app::arrival_steps(arrival, int(prompts->size()), sc.seed);
  if (!arrivals.ok()) return fail(arrivals.error().message);
  KvTypes kv_types;  // a bad type is refused before the model loads
  if (Status st = parse_kv_type_options(sched_opts.kv, &kv_types); !st.ok())
    return fail(st.message());
  auto model = load_model(engine.model);
  if (!model.ok()) return fail(model.error().message);
  auto sched_cfg = to_scheduler_config(sched_opts, **model);
  if (!sched_cfg.ok()) return fail(sched_cfg.error().message);
  SchedulerConfig cfg = *sched_cfg;
  cfg.speculation = *spec;
  std::string note;
  auto backend = make_backend(engine.backend, **model, engine.threads, &note);
  if (!backend.ok()) return fail(backend.error().message);
  std::shared_ptr<Model> draft;
  std::unique_ptr<Backend> draft_backend;
  if (spec->kind == DraftKind::Model) {  // every sequence drafts with it, a cache each
    auto d = load_model(spec->draft_path);
    if (!d.ok()) return fail("draft: " + d.error().message);
    auto be = make_backend(engine.backend, **d, engine.threads, nullptr);
    if (!be.ok()) return fail("draft: " + be.error().message);
    draft = std::move(*d);
    draft_backend = std::move(*be);
  }
  auto sched = Scheduler::create(*model, **backend, cfg, draft, std::move(draft_backend));
  if (!sched.ok()) return fail(sched.error().message);
  Scheduler& s = **sched;
  if (Status st = penalty_config_check(sc.penalties, (*model)->config().n_vocab); !st.ok())
    return fail(st.message());
  for (int32_t id : stop.stop_ids)
    if (id >= (*model)->config().n_vocab)
      return fail("stop-id: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string((*model)->config().n_vocab) + ")");
  // Requests are added in file order; the scheduler's ids number them from 0 (beams take
  // new ids as they fork: a beam request's hypotheses are found from its first id).
  std::vector<int> beam_firsts;
  for (size_t i = 0; i < prompts->size(); ++i) {
    auto ids = tokenize_prompt(**model, PromptSpec{(*prompts)[i], chat, false});
    if (!ids.ok()) return fail("prompt " + std::to_string(i) + ": " + ids.error().message);
    Request r;
    r.prompt = std::move(*ids);
    r.max_tokens = max_tokens;
    r.sampler = sc;
    r.sampler.seed = sc.seed + i;  // each sequence its own stream
    r.stop_ids = stop.stop_ids;
    r.min_tokens = stop.min_tokens;
    r.arrival_step = (*arrivals)[i];
    r.n = samples;
    r.beams = beams;
    r.length_penalty = length_penalty;
    auto id = s.add(std::move(r));
    if (!id.ok()) return fail("prompt " + std::to_string(i) + ": " + id.error().message);
    if (beams > 0) beam_firsts.push_back(*id);
  }
  if (!note.empty()) notice(note);
  int idle_steps = 0;
  while (!s.idle()) {
    auto st = s.step();
    if (!st.ok()) return fail(st.error().message);
    idle_steps = st->rows.empty() ? idle_steps + 1 : 0;
    if (idle_steps > (1 << 22)) return fail("batch: no request could run (internal error)");
    if (json) {
      std::printf("%s\n", step_json(*st, samples).c_str());
      continue;
    }
    for (const SchedEvent& e : st->events) {
      if (e.kind != EventKind::Finish || beams > 0) continue;  // beams: their hypotheses at the end
      if (samples > 1)
        std::printf("[%d.%d] (%s, %d tokens) %s\n\n", e.seq / samples, e.seq % samples,
                    e.detail.c_str(), e.n, s.text(e.seq).c_str());
      else
        std::printf("[%d] (%s, %d tokens) %s\n\n", e.seq, e.detail.c_str(), e.n,
                    s.text(e.seq).c_str());
    }
    std::fflush(stdout);
  }
  if (json) {
    std::printf("%s\n", summary_json(s, int(prompts->size()), beam_firsts).c_str());
  } else {
    for (size_t i = 0; i < beam_firsts.size(); ++i) {
      const auto hyps = s.beam_hypotheses(beam_firsts[i]);
      for (size_t k = 0; k < hyps.size(); ++k)
        std::printf("[%zu] beam %zu/%zu (score %.4f, log p %.3f, %zu tokens, %s) %s\n%s", i,
                    k + 1, hyps.size(), hyps[k].score, hyps[k].logprob,
                    s.generated(hyps[k].seq).size(), hyps[k].finished ? "eos" : "open",
                    s.text(hyps[k].seq).c_str(), k + 1 == hyps.size() ? "\n" : "");
    }
    const SchedulerStats& t = s.stats();
    std::printf(
        "%d sequences in %d steps, %.0f ms: %llu prompt tokens computed (%llu from the prefix "
        "cache), %llu generated, %.1f tokens/s; %d preemptions\n"
        "KV pool peak %.1f MiB against %.1f MiB for contiguous full-context caches; %.0f%% of "
        "allocated slots hold a token (contiguous: %.1f%%); %.1f MiB if no block were shared\n",
        t.finished, t.steps, t.ms, (unsigned long long)t.prefill_tokens,
        (unsigned long long)t.prefix_hit_tokens, (unsigned long long)t.decode_tokens,
        t.ms > 0 ? double(t.decode_tokens) * 1000.0 / t.ms : 0.0, t.preemptions,
        double(t.peak_kv_bytes) / 1048576.0, double(t.contiguous_kv_bytes) / 1048576.0,
        100.0 * t.slot_utilization, 100.0 * t.contiguous_utilization,
        double(t.unshared_kv_bytes) / 1048576.0);
    if (t.ttft_hits > 0)
      std::printf("time to first token: %.1f ms with a prefix-cache hit (%d), %.1f ms without (%d)\n",
                  t.ttft_hit_ms, t.ttft_hits, t.ttft_miss_ms, t.ttft_misses);
    else if (t.ttft_misses > 0)
      std::printf("time to first token: %.1f ms (%d)\n", t.ttft_miss_ms, t.ttft_misses);
    if (cfg.speculation.kind != DraftKind::None)
      std::printf("speculative %s: %llu drafted, %llu accepted (%.1f%%), %.2f tokens per target "
                  "forward\n",
                  speculative_name(cfg.speculation).c_str(), (unsigned long long)t.drafted,
                  (unsigned long long)t.accepted,
                  t.drafted ? 100.0 * double(t.accepted) / double(t.drafted) : 0.0,
                  t.decode_rows ? double(t.decode_row_tokens) / double(t.decode_rows) : 0.0);
  }
  return 0;
}

}  // namespace kvscope::cli
