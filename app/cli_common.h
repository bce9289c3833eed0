// cli_common.h — the headless subcommands of the kvscope executable and their helpers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/status.h"

namespace kvscope::cli {

// `kvscope generate ...`: streams text (or JSON lines with --json). Returns the exit code.
int run_generate(int argc, char** argv);
// `kvscope bench ...`: prefill / decode / NO CACHE timings. Returns the exit code.
int run_bench(int argc, char** argv);
// `kvscope compare ...`: a KV cache configuration against a reference (cli_compare.cpp).
int run_compare(int argc, char** argv);
// `kvscope perplexity ...`: perplexity of a text under a cache configuration.
int run_perplexity(int argc, char** argv);

// A model kvscope knows by name; `scripts/fetch_model.sh NAME` puts its file under
// assets/models/. The first one is the default.
struct BuiltinModel {
  const char* name;  // "smollm2-135m"
  const char* file;  // "SmolLM2-135M-Instruct.Q4_1.gguf"
};
const std::vector<BuiltinModel>& builtin_models();

// The default model path: $KVSCOPE_MODEL, else assets/models/<default> next to the
// executable's source tree or in the current directory.
std::string default_model_path();
// The file --model names: "" is the default model, a built-in name its file (found as
// the default is), anything else a path. An unknown name that is no file, or a built-in
// model not fetched yet, is one clear error saying what to do.
Expected<std::string> resolve_model(const std::string& name_or_path);
// Loads a model (NAME|PATH as resolve_model) with one clear message on failure.
Expected<std::shared_ptr<Model>> load_model(const std::string& name_or_path);
// Backend by name: "auto", "cpu", "cuda". `notice` receives a one-line note when
// auto falls back to the CPU.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Model& model,
                                                int threads, std::string* notice);

}  // namespace kvscope::cli
