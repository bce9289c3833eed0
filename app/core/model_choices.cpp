// model_choices.cpp — the model picker's list (model_choices.h).
#include "app/core/model_choices.h"

#include <algorithm>
#include <cctype>
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

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  return s;
}

// The words of `s` split at spaces, '-', '_' and '.', lower-cased.
std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> out;
  std::string w;
  for (char ch : s + " ") {
    if (ch == ' ' || ch == '-' || ch == '_' || ch == '.') {
      if (!w.empty()) out.push_back(lower(w));
      w.clear();
    } else {
      w += ch;
    }
  }
  return out;
}

// A GGUF quantization tag at the end of a file stem: Q4_0, Q4_K_M, IQ2_XS, F16, BF16, ...
// (case-insensitive), after a '.', '-' or '_'. Returns where it starts, or npos.
size_t quant_tag_start(const std::string& stem) {
  const std::string l = lower(stem);
  for (size_t at = l.size(); at-- > 0;) {
    if (l[at] != '.' && l[at] != '-' && l[at] != '_') continue;
    const std::string tag = l.substr(at + 1);
    const bool q =
        (tag.size() >= 2 && tag[0] == 'q' && std::isdigit((unsigned char)tag[1])) ||
        (tag.size() >= 3 && tag.compare(0, 2, "iq") == 0 && std::isdigit((unsigned char)tag[2]));
    if (q || tag == "f16" || tag == "bf16" || tag == "f32") return at;
  }
  return std::string::npos;
}

}  // namespace

std::string model_display_name(const std::string& general_name, const std::string& file_name) {
  std::string stem = file_name;
  if (stem.size() > 5 && lower(stem.substr(stem.size() - 5)) == ".gguf")
    stem.resize(stem.size() - 5);
  if (size_t at = quant_tag_start(stem); at != std::string::npos && at > 0) stem.resize(at);
  if (stem.empty()) return general_name;
  const std::vector<std::string> name = words(general_name), file = words(stem);
  bool in_file = !name.empty();
  for (const std::string& w : name)
    in_file = in_file && std::find(file.begin(), file.end(), w) != file.end();
  return in_file ? general_name : stem;
}

}  // namespace kvscope::app
