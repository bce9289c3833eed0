// cli_common.h — the headless subcommands of the kvscope executable and their helpers.
#pragma once

#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/status.h"

namespace kvscope::cli {

// `kvscope generate ...`: streams text (or JSON lines with --json). Returns the exit code.
int run_generate(int argc, char** argv);
// `kvscope bench ...`: prefill / decode / NO CACHE timings. Returns the exit code.
int run_bench(int argc, char** argv);

// The default model path: $KVSCOPE_MODEL, else assets/models/<default> next to the
// executable's source tree or in the current directory.
std::string default_model_path();
// Loads a model with one clear message on failure (what was wrong, what to do).
Expected<std::shared_ptr<Model>> load_model(const std::string& path);
// Backend by name: "auto", "cpu", "cuda". `notice` receives a one-line note when
// auto falls back to the CPU.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Model& model,
                                                int threads, std::string* notice);

}  // namespace kvscope::cli
