// engine_options.cpp — the engine group (see engine_options.h).
#include "app/options/engine_options.h"

#include "app/options/options.h"

namespace kvscope::cli {

void add_engine_options(CLI::App& app, EngineArgs& o, bool threads) {
  app.add_option("--model", o.model,
                 "Built-in model name (smollm2-135m, the default; gemma3-270m) or GGUF file path");
  app.add_option("--backend", o.backend, "auto, cuda or cpu")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  if (threads)
    app.add_option("--threads", o.threads,
                   "CPU threads (0 = all; more than the hardware runs are clamped to it)")
        ->check(Range(0, kMaxThreadsOption));
}

void add_thread_list_option(CLI::App& app, std::vector<int>& threads) {
  app.add_option("--threads", threads,
                 "CPU thread counts, comma-separated (0 = all; default: all hardware threads, "
                 "then 1)")
      ->delimiter(',')
      ->check(Range(0, kMaxThreadsOption));
}

void add_mode_option(CLI::App& app, std::string& mode) {
  app.add_option("--mode", mode, "KV cache mode: cache or nocache")
      ->check(CLI::IsMember({"cache", "nocache"}));
}

CacheMode mode_from_option(const std::string& mode) {
  return mode == "nocache" ? CacheMode::NoCache : CacheMode::Cache;
}

void add_max_tokens_option(CLI::App& app, int& max_tokens, const std::string& help) {
  app.add_option("--max-tokens", max_tokens, help)->check(Range(1, kMaxTokensOption));
}

}  // namespace kvscope::cli
