// scheduler_options.cpp — see scheduler_options.h.
#include "app/options/scheduler_options.h"

#include <string>

#include "app/core/serving_run.h"
#include "app/options/options.h"
#include "engine/forward.h"

namespace kvscope::cli {

void add_scheduler_options(CLI::App& app, SchedulerOptions& o) {
  add_kv_type_options(app, o.kv);
  app.add_option("--kv-block", o.block, "Positions per KV block")
      ->check(CLI::IsMember({8, 16, 32}));
  app.add_option("--ctx", o.ctx, "Positions one sequence may hold (default: the model's context)")
      ->check(cli::Range(0, kMaxPositionsOption));
  add_scheduling_options(app, o);
}

void add_scheduling_options(CLI::App& app, SchedulerOptions& o, bool pool_mib) {
  auto* blocks = app.add_option("--kv-pool-blocks", o.pool_blocks,
                                "Size of the KV block pool in blocks (default: blocks for one "
                                "full context)")
                     ->check(cli::Range(1, 1 << 22));
  if (pool_mib)
    app.add_option("--kv-pool-mib", o.pool_mib,
                   "Size of the KV block pool in MiB (instead of --kv-pool-blocks)")
        ->check(cli::Range(1LL, 1LL << 20))
        ->excludes(blocks);
  app.add_option("--max-seqs", o.max_seqs, "Sequences running at once")->check(cli::Range(1, 4096));
  app.add_option("--max-batch-tokens", o.max_batch_tokens, "Tokens through one forward pass")
      ->check(cli::Range(1, kMaxBatchTokens));
  app.add_flag("--no-prefix-cache", o.no_prefix, "Do not reuse cached prompt blocks");
}

Expected<SchedulerConfig> to_scheduler_config(const SchedulerOptions& o, const Model& model) {
  SchedulerConfig cfg;
  if (Status s = parse_kv_type_options(o.kv, &cfg.kv_types); !s.ok()) return s.error();
  cfg.block_size = o.block;
  cfg.context = o.ctx;
  cfg.max_seqs = o.max_seqs;
  cfg.max_batch_tokens = o.max_batch_tokens;
  cfg.prefix_caching = !o.no_prefix;
  if (o.pool_blocks > 0) cfg.pool_blocks = o.pool_blocks;
  if (o.pool_mib > 0) {
    // Blocks as the scheduler makes them: one group of layers each (kv_layer_groups;
    // Gemma 3's windowed and global layers keep theirs apart).
    const KvCacheConfig kc = kv_cache_config(model, cfg.kv_types, KvPolicy::Full);
    KvPoolConfig pc{{kv_layer_groups(kc).size, kc.shape.n_head_kv, kc.shape.head_dim},
                    cfg.kv_types, o.block, 0};
    cfg.pool_blocks = kv_pool_blocks_for_mib(pc, o.pool_mib);
    if (cfg.pool_blocks < 1)
      return make_error("--kv-pool-mib: ", o.pool_mib, " MiB holds no block of ",
                        kv_block_bytes(pc), " bytes");
  }
  return cfg;
}

std::string arrival_spec_error(const std::string& spec) {
  auto at = app::arrival_steps(spec, 1, 0);
  return at.ok() ? "" : at.error().message;
}

void add_arrival_option(CLI::App& app, std::string& spec) {
  app.add_option("--arrival", spec,
                 "When requests arrive: all (at once), every:N (one every N steps) or "
                 "poisson:RATE (RATE per step on average, drawn from --seed)")
      ->check(CLI::Validator(
          [](std::string& v) {
            std::string e = arrival_spec_error(v);
            // CLI11 prefixes the option's name; the message carries it already.
            return e.empty() ? e : e.substr(e.find(' ') + 1);
          },
          "SPEC"));
}

void add_samples_option(CLI::App& app, int& n) {
  app.add_option("--n", n, "Samples per prompt: forked from the prompt's blocks once it is computed")
      ->check(cli::Range(1, 64));
}

BeamOptionRefs add_beam_options(CLI::App& app, int& beams, float& length_penalty) {
  BeamOptionRefs o;
  o.beams = app.add_option("--beams", beams,
                           "Beam search with K beams (forks of the KV blocks) instead of sampling")
                ->check(cli::Range(1, 256));
  o.length_penalty = app.add_option("--length-penalty", length_penalty,
                                    "Beam score = sum log p / length^a (default 1)")
                         ->check(cli::Range(-10.0, 10.0));
  return o;
}

}  // namespace kvscope::cli
