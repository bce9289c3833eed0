// bootstrap.h — how a program starts the engine: the built-in models and where their files
// are found, a model by name or path, a backend by name ("auto", "cpu", "cuda"), and a
// session from both. The CLI, the app and the tests start the engine through these, so a
// model or backend is chosen the same way and fails with the same message everywhere.
// (ggml keeps its backend registry beside the backends for the same reason.)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/session.h"
#include "common/status.h"

namespace kvscope {

// A model kvscope knows by name; `scripts/fetch_model.sh NAME` puts its file under
// assets/models/. The first one is the default.
struct BuiltinModel {
  const char* name;  // "smollm2-135m"
  const char* file;  // "SmolLM2-135M-Instruct.Q4_1.gguf"
};
const std::vector<BuiltinModel>& builtin_models();
// Where built-in model files are looked for, in order: assets/models/ next to the
// executable and each of its parent directories, in the source tree, in the cwd.
std::vector<std::string> asset_model_dirs();

// The default model path: $KVSCOPE_MODEL, else assets/models/<default> next to the
// executable's source tree or in the current directory.
std::string default_model_path();
// The file --model names: "" is the default model, a built-in name its file (found as
// the default is), anything else a path. An unknown name that is no file, or a built-in
// model not fetched yet, is one clear error saying what to do.
Expected<std::string> resolve_model(const std::string& name_or_path);
// Loads a model (NAME|PATH as resolve_model) with one clear message on failure.
Expected<std::shared_ptr<Model>> load_model(const std::string& name_or_path);
// Backend by name: "auto", "cpu", "cuda". `notice` receives a one-line note when auto
// falls back to the CPU (gpu_fallback_notice) or when `threads` is clamped to the
// hardware. An error when the CPU threads cannot be started.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Model& model,
                                                int threads, std::string* notice);

// A session with `cfg` on the model `model` names (load_model; "" is the default) and the
// backend `backend` names (make_backend, with `threads` and `notice`): how generate and
// record start. Errors are load_model's, make_backend's or Session::create's, unchanged.
Expected<std::unique_ptr<Session>> open_session(const std::string& model,
                                                const std::string& backend, int threads,
                                                const SessionConfig& cfg, std::string* notice);

// The one plain sentence shown when `auto` falls back to the CPU, from the CUDA backend's
// error (e.g. "cuda: no usable GPU: no CUDA-capable device; use the CPU backend" becomes
// "No usable GPU (no CUDA-capable device); running on the CPU backend.").
std::string gpu_fallback_notice(const std::string& cuda_error);

}  // namespace kvscope
