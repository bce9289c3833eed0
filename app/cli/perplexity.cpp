// perplexity.cpp — `kvscope perplexity --file TEXT`: perplexity of a text under a KV
// cache configuration (engine/perplexity.h), with the KV bytes the cache held.
//
// The project's long text is /usr/share/common-licenses/GPL-3 (35,149 bytes of English,
// shipped by Debian's essential base-files package, so it exists on every Debian 12
// system): long enough that a 256-position window evicts most of it, short enough to
// stay inside the default model's 8192-position training context.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/bootstrap/bootstrap.h"
#include "app/options/options.h"
#include "app/cli/commands.h"
#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/cli/json_writer.h"
#include "engine/perplexity.h"
#include "engine/utf8.h"

namespace kvscope::cli {
namespace {

}  // namespace

int run_perplexity(int argc, char** argv) {
  CLI::App app{"Perplexity of a text under a KV cache configuration.", "kvscope perplexity"};
  std::string file;
  KvOptions kv;
  add_kv_options(app, kv);
  EngineArgs engine;
  add_engine_options(app, engine);
  int max_tokens = 0;
  bool json = false, progress = false;
  app.add_option("--file", file, "The text (e.g. /usr/share/common-licenses/GPL-3)")->required();
  // Not add_max_tokens_option: here 0 means the whole text, and there is no upper bound.
  app.add_option("--max-tokens", max_tokens, "Use only the first N tokens of the text (0 = all)")
      ->check(AtLeast(0));
  app.add_flag("--json", json, "Print one JSON object");
  app.add_flag("--progress", progress, "Report progress on stderr");
  if (int rc = parse_options(app, argc, argv); rc >= 0) return rc;
  SessionConfig cfg;
  if (Status st = apply_kv_options(kv, cfg); !st.ok()) return fail(st.message());
  cfg.stop_at_eos = false;
  cfg.max_tokens = 1 << 30;
  cfg.top_candidates = 1;

  std::ifstream in(file, std::ios::binary);
  if (!in) return fail("cannot read the text file " + file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  size_t bad = 0;
  if (!utf8_valid(text, &bad))
    return fail("--file: invalid UTF-8 at byte offset " + std::to_string(bad) + " of " + file +
                " (the text must be UTF-8)");

  auto model = load_model(engine.model.empty() ? default_model_path() : engine.model);
  if (!model.ok()) return fail(model.error().message);
  const Tokenizer& tok = (*model)->tokenizer();
  auto ids = tok.encode(text, /*parse_special=*/false);
  if (!ids.ok()) return fail(ids.error().message);
  std::vector<int32_t> tokens;
  if (tok.add_bos() && tok.bos_id() >= 0) tokens.push_back(tok.bos_id());
  tokens.insert(tokens.end(), ids->begin(), ids->end());

  std::string notice;
  auto backend = make_backend(engine.backend, **model, engine.threads, &notice);
  if (!backend.ok()) return fail(backend.error().message);
  auto session = Session::create(*model, std::move(backend.value()), cfg);
  if (!session.ok()) return fail(session.error().message);
  if (!notice.empty()) cli::notice(notice);

  PerplexityProgress report;
  if (progress)
    report = [](int done, int total) {
      if (done % 256 == 0 || done == total) std::fprintf(stderr, "\r%d / %d tokens", done, total);
      if (done == total) std::fprintf(stderr, "\n");
    };
  auto r = perplexity(**session, tokens, max_tokens, report);
  if (!r.ok()) return fail(r.error().message);
  const std::string config = describe_kv_config((*session)->config(), (*model)->config().n_ctx);
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.key("file").value(file);
    j.key("config").value(config);
    j.key("perplexity").value(r->perplexity());
    j.key("mean_nll").value(r->mean_nll());
    j.key("tokens").value(r->tokens);
    j.key("scored").value(r->scored);
    j.key("chunks").value(r->chunks);
    j.key("kv_bytes_max").value(r->kv_bytes_max);
    j.key("kv_bytes_last").value(r->kv_bytes_last);
    j.key("seconds").value(r->seconds);
    j.key("backend").value((*session)->backend().name());
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf(
        "%s: perplexity %.4f (mean NLL %.4f nats) over %d tokens (%d scored, %d chunk%s); "
        "KV bytes at most %llu, last %llu; %.1f s [%s]\n",
        file.c_str(), r->perplexity(), r->mean_nll(), r->tokens, r->scored, r->chunks,
        r->chunks == 1 ? "" : "s", (unsigned long long)r->kv_bytes_max,
        (unsigned long long)r->kv_bytes_last, r->seconds, config.c_str());
  }
  return 0;
}

}  // namespace kvscope::cli
