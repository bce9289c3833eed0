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
  int ctx = 0;            // 0: the model's context
  int max_seqs = 16;
  int max_batch_tokens = 512;
  bool no_prefix = false;
};

// Adds --kv-type, --kv-type-k, --kv-type-v, --kv-block, --kv-pool-mib, --ctx, --max-seqs,
// --max-batch-tokens and --no-prefix-cache.
void add_scheduler_options(CLI::App& app, SchedulerOptions& o);
// The scheduler configuration the options name for `model`; an Error names the option
// (an unknown K/V type, a pool that holds no block).
Expected<SchedulerConfig> to_scheduler_config(const SchedulerOptions& o, const Model& model);

}  // namespace kvscope::cli
