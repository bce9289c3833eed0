// bootstrap.cpp — model name/path resolution, model loading, backend selection and session
// opening for the CLI, the app and the tests.
#include "engine/bootstrap/bootstrap.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "engine/cpu/cpu_backend.h"

#if defined(KVSCOPE_WITH_CUDA)
#include "engine/cuda/cuda_backend.h"
#endif

namespace kvscope {

namespace fs = std::filesystem;

const std::vector<BuiltinModel>& builtin_models() {
  static const std::vector<BuiltinModel> models = {
      {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"},
      {"gemma3-270m", "gemma-3-270m-q4_k_m.gguf"},
  };
  return models;
}

std::vector<std::string> asset_model_dirs() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<std::string> dirs;
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path())
      dirs.push_back((dir / "assets" / "models").string());
  }
#if defined(KVSCOPE_SOURCE_DIR)
  dirs.push_back((fs::path(KVSCOPE_SOURCE_DIR) / "assets" / "models").string());
#endif
  dirs.push_back((fs::path("assets") / "models").string());
  return dirs;
}

namespace {

// assets/models/<file> in the first of asset_model_dirs() that has it, else in the last.
std::string find_asset_model(const std::string& file) {
  std::error_code ec;
  const std::vector<std::string> dirs = asset_model_dirs();
  for (const auto& d : dirs)
    if (fs::exists(fs::path(d) / file, ec)) return (fs::path(d) / file).string();
  return (fs::path(dirs.back()) / file).string();
}

std::string builtin_names() {
  std::string names;
  for (const BuiltinModel& m : builtin_models())
    names += std::string(names.empty() ? "" : ", ") + m.name + (names.empty() ? " (default)" : "");
  return names;
}

}  // namespace

std::string default_model_path() {
  if (const char* env = std::getenv("KVSCOPE_MODEL"); env && *env) return env;
  return find_asset_model(builtin_models().front().file);
}

Expected<std::string> resolve_model(const std::string& name_or_path) {
  std::error_code ec;
  for (const BuiltinModel& m : builtin_models()) {
    if (name_or_path != m.name) continue;
    std::string path = find_asset_model(m.file);
    if (!fs::exists(path, ec))
      return make_error("built-in model '", m.name, "' is not fetched yet (", m.file,
                        " is not in assets/models/): run scripts/fetch_model.sh ", m.name);
    return path;
  }
  const std::string path = name_or_path.empty() ? default_model_path() : name_or_path;
  if (fs::exists(path, ec)) return path;
  if (name_or_path.empty())
    return make_error("model file not found: ", path, " (run scripts/fetch_model.sh to get the ",
                      "default model, or pass --model NAME|PATH)");
  const bool looks_like_path =
      name_or_path.find('/') != std::string::npos || fs::path(name_or_path).extension() == ".gguf";
  if (looks_like_path)
    return make_error("model file not found: ", name_or_path,
                      " (built-in models: ", builtin_names(),
                      "; get one with scripts/fetch_model.sh NAME)");
  return make_error("model not found: '", name_or_path,
                    "' is neither a file nor a built-in model name (built-in: ", builtin_names(),
                    "; get one with scripts/fetch_model.sh NAME, or pass --model PATH to a GGUF "
                    "file)");
}

Expected<std::shared_ptr<Model>> load_model(const std::string& name_or_path) {
  auto path = resolve_model(name_or_path);
  if (!path.ok()) return path.error();
  auto m = Model::load(*path);
  if (!m.ok()) return m.error();
  return std::shared_ptr<Model>(std::move(m.value()));
}

Expected<std::unique_ptr<Session>> open_session(const std::string& model,
                                                const std::string& backend, int threads,
                                                const SessionConfig& cfg, std::string* notice) {
  auto m = load_model(model.empty() ? default_model_path() : model);
  if (!m.ok()) return m.error();
  auto be = make_backend(backend, **m, threads, notice);
  if (!be.ok()) return be.error();
  return Session::create(*m, std::move(be.value()), cfg);
}

std::string gpu_fallback_notice(const std::string& cuda_error) {
  // The reason alone: without the backend's prefixes, its advice (after ';') and the API
  // detail in parentheses, which the sentence replaces.
  std::string why = cuda_error;
  for (const char* prefix : {"cuda: ", "no usable GPU: "})
    if (why.rfind(prefix, 0) == 0) why = why.substr(std::string(prefix).size());
  why = why.substr(0, std::min(why.find(';'), why.find(" (")));
  while (!why.empty() && (why.back() == ' ' || why.back() == '.')) why.pop_back();
  if (why.empty()) return "No usable GPU; running on the CPU backend.";
  return "No usable GPU (" + why + "); running on the CPU backend.";
}

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Model& model,
                                                int threads, std::string* notice) {
  std::string fallback;  // why auto ended on the CPU
  if (name != "cpu") {
    if (name != "auto" && name != "cuda")
      return make_error("unknown backend '", name, "' (choose auto, cuda or cpu)");
#if defined(KVSCOPE_WITH_CUDA)
    auto cuda = make_cuda_backend(model);
    if (cuda.ok()) return std::move(cuda.value());
    if (name == "cuda") return cuda.error();
    fallback = gpu_fallback_notice(cuda.error().message);
#else
    if (name == "cuda")
      return make_error("this kvscope was built without CUDA (nvcc was not found at build time); "
                        "use --backend cpu");
#endif
  }
  std::string clamped;
  auto cpu = create_cpu_backend(threads, &clamped);
  if (!cpu.ok()) return cpu.error();
  if (notice) {
    *notice = fallback;
    if (!clamped.empty()) *notice += (notice->empty() ? "" : " ") + clamped;
  }
  return std::move(cpu.value());
}

}  // namespace kvscope
