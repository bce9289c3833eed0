// cli_kv_options.h — the KV cache options shared by generate, compare and perplexity:
// element types of K and V, the context size, what a full context does (stop or shift,
// keeping n_keep positions), sink + window (engine/kv_policy.h) and what the model's own
// sliding-window layers keep (engine/kv_cache.h KvPolicy). Values are
// checked here and by the engine (Session::create), and a bad one is one clear error line.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/session.h"
#include "engine/status.h"

namespace kvscope::cli {

struct KvOptions {
  std::string kv_type = "f16";  // K and V, unless --kv-type-k / --kv-type-v say otherwise
  std::string kv_type_k, kv_type_v;
  int ctx = 0;  // 0: the model's trained context
  std::string ctx_full = "stop";  // stop | shift
  int n_keep = 0;
  int sink = 0, window = 0;
  std::string kv_keep = "window";  // windowed layers keep their window ("window") or all ("full")
};

// Adds --kv-type, --kv-type-k, --kv-type-v, --ctx, --ctx-full, --n-keep, --kv-sink,
// --kv-window and --kv-keep to `app`,
// with `prefix` before each name (e.g. "ref-").
void add_kv_options(CLI::App& app, KvOptions& o, const std::string& prefix = "");
// Writes the options into `cfg`; an unknown type or a bad size is an Error naming the
// option, the value and what is allowed.
Status apply_kv_options(const KvOptions& o, SessionConfig& cfg, const std::string& prefix = "");
// One line describing a configuration, e.g. "kv f16, ctx 8192, sink 4 + window 256".
std::string describe_kv_config(const SessionConfig& cfg, int model_ctx);

}  // namespace kvscope::cli
