// engine_setup.cpp — opening the engine and finding prompts.
#include "app/core/engine_setup.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/bootstrap/bootstrap.h"

namespace kvscope::app {

Expected<EngineHandle> open_engine(const EngineOptions& opts) {
  EngineHandle h;
  std::string path = opts.model_path.empty() ? default_model_path() : opts.model_path;
  auto model = load_model(path);
  if (!model.ok()) return model.error();
  h.model = model.value();
  auto backend = make_backend(opts.backend, *h.model, opts.threads, &h.notice);
  if (!backend.ok()) return backend.error();
  SessionConfig cfg;
  cfg.mode = opts.mode;
  cfg.max_tokens = opts.max_tokens;
  cfg.kv_types = opts.kv_types;
  cfg.limits = opts.limits;
  cfg.kv_policy = opts.kv_policy;
  cfg.kv_block = opts.kv_block;
  cfg.kv_errors = opts.kv_errors;
  auto session = Session::create(h.model, std::move(backend.value()), cfg);
  if (!session.ok()) return session.error();
  h.session = std::move(session.value());
  return h;
}

bool kv_cache_differs(const EngineOptions& a, const EngineOptions& b) {
  const KvLimits &x = a.limits, &y = b.limits;
  return !(a.kv_types == b.kv_types) || a.kv_policy != b.kv_policy || a.kv_block != b.kv_block ||
         x.n_ctx != y.n_ctx ||
         x.on_full != y.on_full || x.n_keep != y.n_keep || x.sink != y.sink || x.window != y.window;
}

EngineOptions with_kv_cache_of(EngineOptions current, const EngineOptions& edit) {
  current.kv_types = edit.kv_types;
  current.limits = edit.limits;
  current.kv_policy = edit.kv_policy;
  current.kv_block = edit.kv_block;
  return current;
}

Expected<PromptSpec> read_prompt_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error("cannot read prompt file '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  PromptSpec p;
  p.text = ss.str();
  // Optional first line: "#chat" (wrap in the chat template) or "#raw" (plain text).
  for (const char* tag : {"#chat", "#raw"}) {
    std::string t = tag;
    if (p.text.rfind(t + "\n", 0) == 0 || p.text.rfind(t + "\r\n", 0) == 0) {
      p.chat = t == "#chat";
      p.text = p.text.substr(p.text.find('\n') + 1);
    }
  }
  while (!p.text.empty() && (p.text.back() == '\n' || p.text.back() == '\r')) p.text.pop_back();
  if (p.text.empty()) return make_error("prompt file '", path, "' is empty");
  return p;
}

std::vector<PromptChoice> load_prompts() {
  namespace fs = std::filesystem;
  std::vector<fs::path> dirs;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (fs::path d = exe.parent_path(); !d.empty() && d != d.root_path(); d = d.parent_path())
      dirs.push_back(d / "prompts");
#ifdef KVSCOPE_SOURCE_DIR
  dirs.push_back(fs::path(KVSCOPE_SOURCE_DIR) / "prompts");
#endif
  dirs.push_back("prompts");
  std::vector<std::pair<std::string, PromptChoice>> found;  // (file stem, choice)
  for (const fs::path& d : dirs) {
    if (!fs::is_directory(d, ec)) continue;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      if (e.path().extension() != ".txt") continue;
      auto p = read_prompt_file(e.path().string());
      // "01_narrative.txt" -> "narrative" (the number only orders the list).
      std::string stem = e.path().stem().string(), name = stem;
      if (size_t u = stem.find('_');
          u != std::string::npos && u > 0 && stem.find_first_not_of("0123456789") == u)
        name = stem.substr(u + 1);
      if (p.ok()) found.push_back({stem, {name, p.value()}});
    }
    if (!found.empty()) break;
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<PromptChoice> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  if (out.empty()) {
    out.push_back({"narrative", {"Once upon a time, in a kingdom far away, there lived a", false}});
    out.push_back(
        {"code",
         {"def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", false}});
    out.push_back({"chat", {"Explain in two sentences why the sky is blue.", true}});
  }
  return out;
}

}  // namespace kvscope::app
