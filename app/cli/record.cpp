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
#include "app/cli/run_options.h"
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
  std::string out, attention = "f16", csv;
  app.add_option("--out", out, "The run file to write")->required();
  RunOptions run;
  add_run_options(app, run);
  app.add_option("--attention", attention,
                 "How the attention rows are stored: f16 (half the size) or f32 (bit-exact)")
      ->check(CLI::IsMember({"f16", "f32"}));
  app.add_option("--csv", csv, "Also write the per-step numbers as CSV");
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;

  // The prompt and the KV cache options are checked before the model opens, and the
  // prompt (the session's reset) before any file is created.
  auto opened = open_run(run);
  if (!opened.ok()) return fail(opened.error().message);
  const PromptSpec spec = opened->prompt;
  const SessionConfig& cfg = opened->config;
  const SamplerConfig sc = opened->sampler;
  const int max_tokens = run.max_tokens;
  const std::string notice = opened->notice;
  auto source = app::make_session_source(std::move(opened->session));

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
