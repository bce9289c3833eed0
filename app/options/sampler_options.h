// sampler_options.h — how the next token is picked, shared by generate, record and compare
// (the candidate's sampler): --temp, --top-k, --top-p, --min-p and --seed.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include "engine/sampler.h"

namespace kvscope::cli {

inline constexpr double kMaxTemperature = 100.0;  // --temp in [0, 100]
inline constexpr int kMaxTopK = 1 << 24;          // --top-k in 0..2^24

struct SamplerOptions {
  float temp = 0.0f;  // 0: greedy
  int top_k = 0;      // 0: off
  float top_p = 1.0f, min_p = 0.0f;
  uint64_t seed = 0;
};

void add_sampler_options(CLI::App& app, SamplerOptions& o);
SamplerConfig to_sampler_config(const SamplerOptions& o);

}  // namespace kvscope::cli
