// generate.cpp — `kvscope generate`: runs the real engine step by step without a
// window and streams the text, or one JSON object per step with --json.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "engine/bootstrap/bootstrap.h"
#include "app/options/options.h"
#include "app/cli/commands.h"
#include "app/cli/run_options.h"
#include "app/cli/json_writer.h"
#include "engine/printable.h"
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
  j.key("ms").value(tr.ms);
  if (tr.device_ms >= 0) j.key("device_ms").value(tr.device_ms);
  j.key("top").begin_array();
  for (size_t i = 0; i < tr.top.size() && i < 5; ++i) {
    j.begin_object();
    j.key("id").value(tr.top[i].id);
    j.key("text").value(tr.top[i].text);
    j.key("p").value(double(tr.top[i].p));
    j.key("logit").value(double(tr.top[i].logit));
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.str();
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
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;

  auto opened = open_run(run);
  if (!opened.ok()) return fail(opened.error().message);
  Session& s = *opened->session;
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
    j.key("text").value(s.generated_text());
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

}  // namespace kvscope::cli
