// speculative_options.h — speculative decoding, shared by generate (a Session) and batch
// (the scheduler): --speculative ngram|early-exit:L|draft:PATH and --draft-max K
// (engine/speculative.h). One bound and one message for each, whichever command.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common/status.h"
#include "engine/speculative.h"

namespace kvscope::cli {

struct SpeculativeOptions {
  std::string spec;  // empty: no speculation
  int draft_max = 4;
};

// Adds --speculative and --draft-max (1..15). `draft_model`: whether draft:PATH is offered
// (in the help; the value is refused later by the command that cannot run it).
void add_speculative_options(CLI::App& app, SpeculativeOptions& o, bool draft_model = true);
// The configuration the options name (kind None when --speculative is not given); an
// unknown form is speculative_parse's Error.
Expected<SpeculativeConfig> to_speculative_config(const SpeculativeOptions& o);

}  // namespace kvscope::cli
