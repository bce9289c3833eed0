// cli_common.cpp — model path resolution, model loading and backend selection for the CLI.
#include "app/cli_common.h"

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "engine/cpu/cpu_backend.h"

#if defined(KVSCOPE_WITH_CUDA)
#include "engine/cuda/cuda_backend.h"
#endif

namespace kvscope::cli {

namespace fs = std::filesystem;
constexpr const char* kDefaultModel = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string default_model_path() {
  if (const char* env = std::getenv("KVSCOPE_MODEL"); env && *env) return env;
  std::error_code ec;
  // Next to the executable (build tree or install), then the source tree, then the cwd.
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path())
      candidates.push_back(dir / "assets" / "models" / kDefaultModel);
  }
#if defined(KVSCOPE_SOURCE_DIR)
  candidates.push_back(fs::path(KVSCOPE_SOURCE_DIR) / "assets" / "models" / kDefaultModel);
#endif
  candidates.push_back(fs::path("assets") / "models" / kDefaultModel);
  for (const auto& c : candidates)
    if (fs::exists(c, ec)) return c.string();
  return candidates.back().string();
}

Expected<std::shared_ptr<Model>> load_model(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return make_error("model file not found: ", path,
                      " (run scripts/fetch_model.sh to get the default model, or pass --model "
                      "PATH to a llama-architecture GGUF file)");
  auto m = Model::load(path);
  if (!m.ok()) return m.error();
  return std::shared_ptr<Model>(std::move(m.value()));
}

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Model& model,
                                                int threads, std::string* notice) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name != "auto" && name != "cuda")
    return make_error("unknown backend '", name, "' (choose auto, cuda or cpu)");
#if defined(KVSCOPE_WITH_CUDA)
  auto cuda = make_cuda_backend(model);
  if (cuda.ok()) return std::move(cuda.value());
  if (name == "cuda") return cuda.error();
  if (notice) *notice = "no usable GPU (" + cuda.error().message + "); using the CPU backend";
#else
  if (name == "cuda")
    return make_error("this kvscope was built without CUDA (nvcc was not found at build time); "
                      "use --backend cpu");
#endif
  return make_cpu_backend(threads);
}

}  // namespace kvscope::cli
