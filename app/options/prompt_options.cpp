// prompt_options.cpp — prompt options of the headless subcommands (see prompt_options.h).
#include "app/options/prompt_options.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace kvscope::cli {

void add_prompt_options(CLI::App& app, PromptOptions& o, bool file_only) {
  auto* pf = app.add_option("--prompt-file", o.file,
                            "Prompt file (first line #chat or #raw picks the form)");
  if (file_only) return;
  o.text_opt = app.add_option("--prompt", o.text, "Prompt text");
  o.text_opt->excludes(pf);
  app.add_flag("--chat", o.chat, "Wrap the prompt as one user turn in the chat template");
}

Expected<PromptSpec> read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read the prompt file ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  PromptSpec spec;
  spec.text = ss.str();
  auto strip_header = [&](const char* tag, bool chat) {
    const std::string t = tag;
    if (spec.text.rfind(t, 0) == 0 &&
        (spec.text.size() == t.size() || spec.text[t.size()] == '\n')) {
      spec.text.erase(0, std::min(spec.text.size(), t.size() + 1));
      spec.chat = chat;
      return true;
    }
    return false;
  };
  if (!strip_header("#chat", true)) strip_header("#raw", false);
  while (!spec.text.empty() && spec.text.back() == '\n') spec.text.pop_back();
  return spec;
}

Expected<PromptSpec> prompt_from_options(const PromptOptions& o) {
  PromptSpec spec;
  if (!o.file.empty()) {
    auto p = read_prompt_file(o.file);
    if (!p.ok()) return p.error();
    spec = *p;
    if (o.chat) spec.chat = true;
  } else if (o.text_opt && o.text_opt->count() > 0) {
    spec.text = o.text;
    spec.chat = o.chat;
  } else {
    return make_error("no prompt: pass --prompt TEXT or --prompt-file FILE");
  }
  if (spec.text.empty()) return make_error("prompt: the prompt is empty");
  return spec;
}

}  // namespace kvscope::cli
