// sampler_options.h — how the next token is picked, shared by generate, record, batch and
// compare (the candidate's sampler): --temp, --top-k, --top-p, --min-p and --seed, and the
// penalties (engine/sampler.h): --repeat-penalty, --repeat-last-n, --frequency-penalty,
// --presence-penalty, --no-repeat-ngram and --logit-bias ID=BIAS. The stop options of a run
// (generate, record, batch): --stop-id ID and --min-tokens N.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/sampler.h"

namespace kvscope::cli {

inline constexpr double kMaxTemperature = 100.0;  // --temp in [0, 100]
inline constexpr int kMaxTopK = 1 << 24;          // --top-k in 0..2^24

struct SamplerOptions {
  float temp = 0.0f;  // 0: greedy
  int top_k = 0;      // 0: off
  float top_p = 1.0f, min_p = 0.0f;
  uint64_t seed = 0;
  float repeat_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
  int repeat_last_n = 64, no_repeat_ngram = 0;
  std::vector<std::string> logit_bias;  // "ID=BIAS"
};

void add_sampler_options(CLI::App& app, SamplerOptions& o);
// --temp alone (the app's Serving view), with the same bound and message.
void add_temperature_option(CLI::App& app, float& temp);
// The sampler the options name; a malformed --logit-bias is an Error naming it.
Expected<SamplerConfig> to_sampler_config(const SamplerOptions& o);

struct StopOptions {
  std::vector<int32_t> stop_ids;
  int min_tokens = 0;
};
void add_stop_options(CLI::App& app, StopOptions& o);

}  // namespace kvscope::cli
