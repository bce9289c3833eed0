// prompt_options.h — the prompt options shared by the subcommands that generate (generate,
// compare, record; the app takes --prompt-file): --prompt TEXT, --prompt-file FILE (a first line "#chat" or "#raw" says how
// the rest is used) and --chat.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/session.h"
#include "common/status.h"

namespace kvscope::cli {

struct PromptOptions {
  std::string text, file;
  bool chat = false;
  CLI::Option* text_opt = nullptr;
};

// Adds --prompt, --prompt-file and --chat; only --prompt-file when `file_only` (the app,
// whose prompt box takes the rest).
void add_prompt_options(CLI::App& app, PromptOptions& o, bool file_only = false);
// The prompt the options name; errors: no prompt, an unreadable file, an empty prompt.
Expected<PromptSpec> prompt_from_options(const PromptOptions& o);
// Reads a prompt file (see above).
Expected<PromptSpec> read_prompt_file(const std::string& path);

}  // namespace kvscope::cli
