// engine_options.h — the options that pick and run the engine, shared by the app and the
// subcommands: --model, --backend, --threads (the engine group), --mode and --max-tokens.
// Each option is declared here once, with its bound and help, for every command that has it.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "engine/session.h"

namespace kvscope::cli {

// Upper bound of every --threads option (0 = all hardware threads); values above the
// hardware's threads are accepted and clamped with a notice (make_backend).
inline constexpr int kMaxThreadsOption = 65536;
// Upper bound of --max-tokens (the app, generate, record, compare) and of the app's
// --measure and --view-step: steps of one run.
inline constexpr int kMaxTokensOption = 1 << 20;

struct EngineArgs {
  std::string model;  // a built-in model name or a GGUF path; empty: the default model
  std::string backend = "auto";  // auto | cuda | cpu
  int threads = 0;               // 0: all hardware threads
};

// Adds --model and --backend, and --threads unless `threads` is false (the app has none;
// bench takes a list, add_thread_list_option).
void add_engine_options(CLI::App& app, EngineArgs& o, bool threads = true);
// bench's --threads: thread counts, comma-separated, each with --threads' bound.
void add_thread_list_option(CLI::App& app, std::vector<int>& threads);

// --mode cache|nocache.
void add_mode_option(CLI::App& app, std::string& mode);
CacheMode mode_from_option(const std::string& mode);
// --max-tokens N in 1..kMaxTokensOption; `help` says what the steps are.
void add_max_tokens_option(CLI::App& app, int& max_tokens, const std::string& help);

}  // namespace kvscope::cli
