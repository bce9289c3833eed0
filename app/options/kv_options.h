// kv_options.h — the KV cache options shared by generate, record, compare, perplexity and
// the app: element types of K and V, the block size of the KV pool, the context size, what a full context does (stop or shift,
// keeping n_keep positions), sink + window (engine/kv_policy.h) and what the model's own
// sliding-window layers keep (engine/kv_cache.h KvPolicy). Values are
// checked here and by the engine (Session::create), and a bad one is one clear error line.
// bench takes only the element types (add_kv_type_options), parsed by the same code, so a
// bad type gives the same line from every subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/session.h"
#include "common/status.h"

namespace kvscope::cli {

// Upper bound of every option that counts positions: --ctx, --n-keep, --kv-sink,
// --kv-window (and their --ref- forms), the app's --highlight and --look-at. The engine
// checks them against the model's context (Session::create).
inline constexpr int kMaxPositionsOption = 1 << 24;

// --kv-type, --kv-type-k, --kv-type-v: the element types of cached K and V.
struct KvTypeOptions {
  std::string kv_type = "f16";  // K and V, unless --kv-type-k / --kv-type-v say otherwise
  std::string kv_type_k, kv_type_v;
};

struct KvOptions : KvTypeOptions {
  int ctx = 0;  // 0: the model's trained context
  std::string ctx_full = "stop";  // stop | shift
  int n_keep = 0;
  int sink = 0, window = 0;
  std::string kv_keep = "window";  // windowed layers keep their window ("window") or all ("full")
  int block = 16;  // positions per block of the KV pool
};

// Adds --kv-type, --kv-type-k and --kv-type-v to `app`, with `prefix` before each name.
void add_kv_type_options(CLI::App& app, KvTypeOptions& o, const std::string& prefix = "");
// The types the options name: --kv-type for both sides, then --kv-type-k / --kv-type-v
// for theirs; an unknown name is an Error "--kv-type-k: unknown cache type 'x' (choose
// ...)".
Status parse_kv_type_options(const KvTypeOptions& o, KvTypes* out, const std::string& prefix = "");

// Adds --kv-type, --kv-type-k, --kv-type-v, --ctx, --ctx-full, --n-keep, --kv-sink,
// --kv-window, --kv-keep and --kv-block to `app`,
// with `prefix` before each name (e.g. "ref-").
void add_kv_options(CLI::App& app, KvOptions& o, const std::string& prefix = "");
// Writes the options into `cfg`; an unknown type or a bad size is an Error naming the
// option, the value and what is allowed.
Status apply_kv_options(const KvOptions& o, SessionConfig& cfg, const std::string& prefix = "");

}  // namespace kvscope::cli
