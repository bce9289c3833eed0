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

// The name the app shows for a model: its `general_name` when every word of it is in the
// file's name ("Gemma 3 270m" for gemma-3-270m-q4_k_m.gguf), else the file's name without
// ".gguf" and its quantization tag ("SmolLM2-135M-Instruct", where general.name is a
// training run's "Smollm2 135M 8k Lc100K Mix1 Ep2"). No file name: general_name.
std::string model_display_name(const std::string& general_name, const std::string& file_name);

}  // namespace kvscope::app
