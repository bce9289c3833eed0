// kv_options.cpp — KV cache options of the headless subcommands (see kv_options.h).
#include "app/options/kv_options.h"

#include "app/options/options.h"

namespace kvscope::cli {
namespace {

Status parse_type(const std::string& option, const std::string& name, KvDtype* out) {
  if (!kv_dtype_parse(name, out))
    return make_error(option, ": unknown cache type '", name, "' (choose ", kv_dtype_choices(),
                      ")");
  return Status::Ok();
}

}  // namespace

void add_kv_type_options(CLI::App& app, KvTypeOptions& o, const std::string& prefix) {
  const std::string types = std::string(" (") + kv_dtype_choices() + ")";
  app.add_option("--" + prefix + "kv-type", o.kv_type, "KV cache element type of K and V" + types);
  app.add_option("--" + prefix + "kv-type-k", o.kv_type_k,
                 "Element type of cached K (default: --kv-type)");
  app.add_option("--" + prefix + "kv-type-v", o.kv_type_v,
                 "Element type of cached V (default: --kv-type)");
}

Status parse_kv_type_options(const KvTypeOptions& o, KvTypes* out, const std::string& prefix) {
  const std::string p = "--" + prefix;
  KV_TRY(parse_type(p + "kv-type", o.kv_type, &out->k));
  out->v = out->k;
  // --kv-type-k / --kv-type-v override --kv-type for their side.
  if (!o.kv_type_k.empty()) KV_TRY(parse_type(p + "kv-type-k", o.kv_type_k, &out->k));
  if (!o.kv_type_v.empty()) KV_TRY(parse_type(p + "kv-type-v", o.kv_type_v, &out->v));
  return Status::Ok();
}

void add_kv_options(CLI::App& app, KvOptions& o, const std::string& prefix) {
  add_kv_type_options(app, o, prefix);
  app.add_option("--" + prefix + "ctx", o.ctx,
                 "Context size in tokens (0 = the model's trained context)")
      ->check(Range(0, kMaxPositionsOption));
  app.add_option("--" + prefix + "ctx-full", o.ctx_full,
                 "When the context is full: stop, or shift (drop the oldest half after "
                 "--n-keep and re-rotate the rest)");
  app.add_option("--" + prefix + "n-keep", o.n_keep,
                 "With --ctx-full shift: positions kept at the start")
      ->check(Range(0, kMaxPositionsOption));
  app.add_option("--" + prefix + "kv-window", o.window,
                 "Keep only the last W positions in every layer (0 = off)")
      ->check(Range(0, kMaxPositionsOption));
  app.add_option("--" + prefix + "kv-sink", o.sink,
                 "With --kv-window: keep the first S positions too (attention sinks)")
      ->check(Range(0, kMaxPositionsOption));
  app.add_option("--" + prefix + "kv-keep", o.kv_keep,
                 "What the model's sliding-window layers keep: window (only the positions their "
                 "window sees, the default) or full (every position; the window still masks)");
  app.add_option("--" + prefix + "kv-block", o.block, "Positions per KV block")
      ->check(CLI::IsMember({8, 16, 32}));
}

Status apply_kv_options(const KvOptions& o, SessionConfig& cfg, const std::string& prefix) {
  KV_TRY(parse_kv_type_options(o, &cfg.kv_types, prefix));
  const std::string p = "--" + prefix;
  if (o.ctx < 0) return make_error(p, "ctx: ", o.ctx, " is negative (0 = the model's)");
  cfg.limits.n_ctx = o.ctx;
  if (!context_policy_parse(o.ctx_full, &cfg.limits.on_full))
    return make_error(p, "ctx-full: unknown policy '", o.ctx_full, "' (choose stop or shift)");
  cfg.limits.n_keep = o.n_keep;
  cfg.limits.sink = o.sink;
  cfg.limits.window = o.window;
  if (!kv_block_size_ok(o.block))
    return make_error(p, "kv-block: ", o.block, " positions per block is not one of ",
                      kv_block_size_choices());
  cfg.kv_block = o.block;
  if (o.kv_keep == "window")
    cfg.kv_policy = KvPolicy::ModelWindow;
  else if (o.kv_keep == "full")
    cfg.kv_policy = KvPolicy::Full;
  else
    return make_error(p, "kv-keep: unknown value '", o.kv_keep, "' (choose window or full)");
  return Status::Ok();
}


}  // namespace kvscope::cli
