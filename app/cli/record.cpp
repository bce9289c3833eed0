// record.cpp — `kvscope record --out run.kvs ...`: runs the model step by step without a
// window and writes the whole run (prompt, settings, model identity, every step's trace) to
// a run file (docs/run_file.md); `kvscope export run.kvs --csv stats.csv`: the per-step
// numbers of a run file as CSV, without the model.
#include "app/cli/commands.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "engine/bootstrap/bootstrap.h"
#include "app/options/options.h"
#include "app/cli/commands.h"
#include "app/options/kv_options.h"
#include "app/core/engine_setup.h"
#include "app/core/run_driver.h"
#include "app/core/stats_csv.h"

#ifndef KVSCOPE_VERSION
#define KVSCOPE_VERSION "dev"
#endif

namespace kvscope::cli {
namespace {

std::unique_ptr<std::ofstream> open_csv(const std::string& path, std::string* err) {
  auto f = std::make_unique<std::ofstream>(path, std::ios::binary | std::ios::trunc);
  if (!*f) {
    *err = "cannot write the CSV file '" + path + "'";
    return nullptr;
  }
  app::write_stats_csv_header(*f);
  return f;
}

}  // namespace

int run_record(int argc, char** argv) {
  CLI::App app{
      "Run the model without a window and write the whole run to a run file "
      "(replay it with kvscope --replay FILE).",
      "kvscope record"};
  std::string out, prompt, prompt_file, mode = "cache", model_path, backend_name = "auto",
                                        attention = "f16", csv;
  KvOptions kv;
  bool chat = false;
  int max_tokens = 64, threads = 0, top_k = 0;
  float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
  uint64_t seed = 0;
  app.add_option("--out", out, "The run file to write")->required();
  auto* p_opt = app.add_option("--prompt", prompt, "Prompt text");
  auto* pf_opt = app.add_option("--prompt-file", prompt_file,
                                "Prompt file (first line #chat or #raw picks the form)");
  p_opt->excludes(pf_opt);
  app.add_flag("--chat", chat, "Wrap the prompt as one user turn in the chat template");
  app.add_option("--mode", mode, "KV cache mode")->check(CLI::IsMember({"cache", "nocache"}));
  app.add_option("--max-tokens", max_tokens, "Tokens to generate")->check(Range(1, 1 << 20));
  app.add_option("--temp", temp, "Temperature (0 = greedy)")->check(Range(0.0, 100.0));
  app.add_option("--top-k", top_k, "Keep the k most likely tokens (0 = off)")
      ->check(Range(0, 1 << 24));
  app.add_option("--top-p", top_p, "Nucleus sampling mass (1 = off)")->check(Range(0.0, 1.0));
  app.add_option("--min-p", min_p, "Drop tokens below min-p x the best (0 = off)")
      ->check(Range(0.0, 1.0));
  app.add_option("--seed", seed, "Sampling seed");
  app.add_option("--threads", threads, "CPU threads (0 = all)")->check(Range(0, kMaxThreadsOption));
  app.add_option("--model", model_path,
                 "A built-in model name (smollm2-135m, gemma3-270m) or a GGUF file");
  app.add_option("--backend", backend_name, "auto, cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  add_kv_options(app, kv);
  app.add_option("--attention", attention,
                 "How the attention rows are stored: f16 (half the size) or f32 (bit-exact)")
      ->check(CLI::IsMember({"f16", "f32"}));
  app.add_option("--csv", csv, "Also write the per-step numbers as CSV");
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;

  PromptSpec spec;
  if (!prompt_file.empty()) {
    auto p = app::read_prompt_file(prompt_file);
    if (!p.ok()) return fail(p.error().message);
    spec = *p;
    if (chat) spec.chat = true;
  } else if (p_opt->count() > 0) {
    spec.text = prompt;
    spec.chat = chat;
  } else {
    return fail("no prompt: pass --prompt TEXT or --prompt-file FILE");
  }
  // The KV cache options before the model, as generate checks them.
  SessionConfig cfg;
  if (Status st = apply_kv_options(kv, cfg); !st.ok()) return fail(st.message());
  cfg.mode = mode == "cache" ? CacheMode::Cache : CacheMode::NoCache;
  cfg.max_tokens = max_tokens;
  std::string notice;
  auto session = open_session(model_path, backend_name, threads, cfg, &notice);
  if (!session.ok()) return fail(session.error().message);
  SamplerConfig sc;
  sc.temperature = temp;
  sc.top_k = top_k;
  sc.top_p = top_p;
  sc.min_p = min_p;
  sc.seed = seed;
  session.value()->set_sampler(sc);
  // Check the prompt before creating any file.
  if (Status st = session.value()->reset(spec); !st.ok()) return fail(st.message());
  auto source = app::make_session_source(std::move(session.value()));

  app::RunMeta meta;
  meta.producer = std::string("kvscope ") + KVSCOPE_VERSION;
  meta.model = source->facts();
  meta.prompt = spec;
  meta.mode = cfg.mode;
  meta.sampler = sc;
  meta.max_tokens = max_tokens;
  meta.attention = attention == "f32" ? app::AttnEncoding::F32 : app::AttnEncoding::F16;
  auto file = app::RunFile::create(out, meta);
  if (!file.ok()) return fail(file.error().message);
  std::string err;
  std::unique_ptr<std::ofstream> csv_out;
  if (!csv.empty() && !(csv_out = open_csv(csv, &err))) return fail(err);
  if (!notice.empty()) cli::notice(notice);

  app::DriveOptions opts;
  opts.steps = max_tokens;
  opts.record = file.value();
  if (csv_out) opts.on_step = [&](const StepTrace& t) { app::write_stats_csv_row(*csv_out, t); };
  auto end = app::drive_run(*source, spec, opts);
  if (!end.ok()) return fail(end.error().message);
  if (csv_out && !csv_out->flush()) return fail("cannot write the CSV file '" + csv + "'");
  std::printf("kvscope: recorded %d steps (%s) of %s to %s (%.1f MiB)\n", end->steps,
              end->reason.c_str(), meta.model.name.c_str(), out.c_str(),
              double(file.value()->bytes()) / 1048576.0);
  return 0;
}

int run_export(int argc, char** argv) {
  CLI::App app{"Write a run file's per-step numbers as CSV (no model needed).", "kvscope export"};
  std::string in, csv = "-";
  app.add_option("run", in, "The run file (.kvs)")->required();
  app.add_option("--csv", csv, "Output CSV file (- = standard output)");
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;
  auto file = app::RunFile::open(in);
  if (!file.ok()) return fail(file.error().message);
  std::unique_ptr<std::ofstream> f;
  std::string err;
  if (csv != "-" && !(f = open_csv(csv, &err))) return fail(err);
  std::ostream& out = f ? static_cast<std::ostream&>(*f) : std::cout;
  if (!f) app::write_stats_csv_header(out);
  for (uint64_t off : file.value()->step_offsets()) {
    auto t = file.value()->read_step(off);
    if (!t.ok()) return fail(t.error().message);
    app::write_stats_csv_row(out, t.value());
  }
  out.flush();
  if (!out) return fail("cannot write the CSV file '" + csv + "'");
  return 0;
}

}  // namespace kvscope::cli
