// model_choices.cpp — the model picker's list (model_choices.h).
#include "app/core/model_choices.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "engine/bootstrap/bootstrap.h"

namespace kvscope::app {

namespace fs = std::filesystem;

std::vector<ModelChoice> model_choices(const std::vector<std::string>& dirs) {
  std::vector<ModelChoice> out;
  std::error_code ec;
  auto builtin_file = [](const std::string& name) {
    for (const BuiltinModel& m : builtin_models())
      if (name == m.file) return true;
    return false;
  };
  for (const BuiltinModel& m : builtin_models()) {
    ModelChoice c{m.name, m.name, true, false};
    for (const std::string& d : dirs)
      c.present = c.present || fs::is_regular_file(fs::path(d) / m.file, ec);
    out.push_back(std::move(c));
  }
  std::map<std::string, std::string> others;  // file name -> path, sorted by name
  for (const std::string& d : dirs) {
    fs::directory_iterator it(d, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      std::string ext = p.extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(),
                     [](unsigned char ch) { return char(std::tolower(ch)); });
      const std::string name = p.filename().string();
      if (ext != ".gguf" || builtin_file(name) || !it->is_regular_file(ec)) continue;
      others.emplace(name, p.string());
    }
    ec.clear();
  }
  for (const auto& [name, path] : others) out.push_back({name, path, false, true});
  return out;
}

}  // namespace kvscope::app
