// scheduler_options.h — the options of the continuous-batching scheduler that `batch` and
// `serve` share: the KV element types, block size, pool size, context per sequence,
// sequences at once, tokens per forward and prefix caching (engine/scheduler.h).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include "app/options/kv_options.h"
#include "engine/model.h"
#include "engine/scheduler.h"

namespace kvscope::cli {

struct SchedulerOptions {
  KvTypeOptions kv;
  int block = 16;
  uint64_t pool_mib = 0;  // 0: blocks for one full context
  int pool_blocks = 0;    // --kv-pool-blocks (instead of --kv-pool-mib); 0: not given
  int ctx = 0;            // 0: the model's context
  int max_seqs = 16;
  int max_batch_tokens = 512;
  bool no_prefix = false;
};

// Adds --kv-type, --kv-type-k, --kv-type-v, --kv-block, --ctx, and the scheduling options
// below.
void add_scheduler_options(CLI::App& app, SchedulerOptions& o);
// Adds --kv-pool-mib, --kv-pool-blocks, --max-seqs, --max-batch-tokens and
// --no-prefix-cache (the app, whose KV options come from kv_options.h, takes these alone).
// Without --kv-pool-mib when `pool_mib` is false.
void add_scheduling_options(CLI::App& app, SchedulerOptions& o, bool pool_mib = true);
// --arrival SPEC: when requests arrive (all, every:N, poisson:RATE), checked when parsed.
void add_arrival_option(CLI::App& app, std::string& spec);
// --n N: samples per prompt, 1..64.
void add_samples_option(CLI::App& app, int& n);
// --beams K (beam search with K beams instead of sampling) and --length-penalty a (a
// hypothesis scores sum log p / length^a; 1..256 beams: a scheduler holds at most
// min(64, max-seqs)); `beams` keeps its value unless given. The
// options as created, for excludes() and count().
struct BeamOptionRefs {
  CLI::Option* beams = nullptr;
  CLI::Option* length_penalty = nullptr;
};
BeamOptionRefs add_beam_options(CLI::App& app, int& beams, float& length_penalty);
// The spec's error (the --arrival message), or "" when it is valid.
std::string arrival_spec_error(const std::string& spec);
// The scheduler configuration the options name for `model`; an Error names the option
// (an unknown K/V type, a pool that holds no block).
Expected<SchedulerConfig> to_scheduler_config(const SchedulerOptions& o, const Model& model);

}  // namespace kvscope::cli
