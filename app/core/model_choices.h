// model_choices.h — what the app's model picker offers: the built-in models by name (and
// whether their file has been fetched), then every other GGUF file found in the model
// directories (assets/models/, asset_model_dirs()), each once, by file name.
#pragma once

#include <string>
#include <vector>

namespace kvscope::app {

struct ModelChoice {
  std::string label;     // "smollm2-135m", "my-model.Q8_0.gguf"
  std::string open;      // what opens it (EngineOptions::model_path): a built-in name or a path
  bool builtin = false;  // a built-in model (label == open == its name)
  bool present = true;   // its file is there (a built-in model may not be fetched yet)
};

// Built-in models first (in builtin_models() order), then the other `.gguf` files of
// `dirs` sorted by file name; a file name found in several directories is listed once, from
// the first. Directories that do not exist are skipped.
std::vector<ModelChoice> model_choices(const std::vector<std::string>& dirs);

}  // namespace kvscope::app
