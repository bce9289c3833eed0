// run_options.h — what generate and record share: the options of a run (prompt, cache
// mode, token limit, sampler, engine, KV cache) and opening the session they name.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/options/prompt_options.h"
#include "app/options/sampler_options.h"
#include "common/status.h"
#include "engine/session.h"

namespace kvscope::cli {

struct RunOptions {
  PromptOptions prompt;
  std::string mode = "cache";
  int max_tokens = 64;
  SamplerOptions sampler;
  StopOptions stop;
  EngineArgs engine;
  KvOptions kv;
  std::vector<std::string> stops;  // generate's --stop (record has none)
};

// Adds the prompt, --mode, --max-tokens, the sampler and stop options, the engine and the
// KV cache options.
void add_run_options(CLI::App& app, RunOptions& o);

// A session as the options say, reset with their prompt. The prompt and the KV cache
// options are checked before the model opens; `notice` gets the backend's one-line note
// (e.g. no usable GPU), to print once the input is known to be good.
struct OpenedRun {
  PromptSpec prompt;
  SessionConfig config;
  SamplerConfig sampler;
  std::unique_ptr<Session> session;
  std::string notice;
};
Expected<OpenedRun> open_run(const RunOptions& o);

}  // namespace kvscope::cli
