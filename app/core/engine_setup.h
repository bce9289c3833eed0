// engine_setup.h — model + backend + Session creation for the app, and the prompts it offers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/session.h"

namespace kvscope::app {

struct EngineOptions {
  std::string model_path;  // empty = the default model
  std::string backend = "auto";
  int threads = 0;  // 0 = the backend's default
  CacheMode mode = CacheMode::Cache;
  int max_tokens = 256;
  // The KV cache (engine/kv_policy.h): K and V element types, context size (0: the
  // model's), sink + window (window 0: off). The engine checks them (Session::create).
  KvTypes kv_types;
  KvLimits limits;
  // What the model's own sliding-window layers keep (Gemma 3): their window, or every
  // position (the CLI's --kv-keep window|full).
  KvPolicy kv_policy = KvPolicy::ModelWindow;
  int kv_block = 16;  // positions per block of the KV pool (the CLI's --kv-block)
  // Measure each written K/V row's quantization error (the error colouring of the KV blocks).
  bool kv_errors = false;
};

// The KV cache part of the options (types, limits, window policy): whether two differ, and
// `current` with the cache of `edit` (what the Run section's Apply reopens the model with).
bool kv_cache_differs(const EngineOptions& a, const EngineOptions& b);
EngineOptions with_kv_cache_of(EngineOptions current, const EngineOptions& edit);

struct EngineHandle {
  std::shared_ptr<Model> model;
  std::unique_ptr<Session> session;
  std::string notice;  // e.g. "No usable GPU (no CUDA-capable device); running on the CPU backend."
};

Expected<EngineHandle> open_engine(const EngineOptions& opts);

struct PromptChoice {
  std::string name;  // file stem, e.g. "narrative"
  PromptSpec spec;
};
// prompts/*.txt (next to the executable's source tree or the cwd), sorted by name;
// built-in narrative/code/chat prompts when none are found. A file whose first line is
// "#chat" is a chat prompt (that line is dropped).
std::vector<PromptChoice> load_prompts();
Expected<PromptSpec> read_prompt_file(const std::string& path);

}  // namespace kvscope::app
