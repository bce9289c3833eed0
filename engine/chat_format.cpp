// chat_format.cpp — recognizing a chat template's family and writing its turns (see
// chat_format.h).
#include "engine/chat_format.h"

namespace kvscope {
namespace {

// Strips ASCII whitespace at both ends, as the Gemma and Llama 2 templates trim content.
std::string_view trim(std::string_view s) {
  auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// The ChatML default system message: the literal text of a
// '<|im_start|>system\n...<|im_end|>' string in the template. Occurrences built from a
// variable ('<|im_start|>system\n' + messages[0]['content'] ...) hold quotes and are
// skipped.
std::string chatml_default_system(std::string_view text) {
  static constexpr std::string_view kOpen = "<|im_start|>system", kClose = "<|im_end|>";
  for (size_t at = text.find(kOpen); at != std::string_view::npos; at = text.find(kOpen, at + 1)) {
    size_t begin = at + kOpen.size();
    if (text.substr(begin, 1) == "\n") {
      begin += 1;
    } else if (text.substr(begin, 2) == "\\n") {  // the newline written as an escape
      begin += 2;
    } else {
      continue;
    }
    const size_t end = text.find(kClose, begin);
    if (end == std::string_view::npos) break;
    const std::string_view body = text.substr(begin, end - begin);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += body[i];
      }
    }
    return out;
  }
  return {};
}

std::string chatml(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen) {
  std::string out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out.append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
  };
  if (!t.default_system.empty() && !messages.empty() && messages.front().role != "system")
    turn("system", t.default_system);
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string gemma(const std::vector<ChatMessage>& messages, bool gen) {
  std::string out, prefix;
  size_t first = 0;
  if (!messages.empty() && messages.front().role == "system") {
    prefix = std::string(messages.front().content) + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    out.append("<start_of_turn>").append(m.role == "assistant" ? "model" : m.role).append("\n");
    if (i == first) out += prefix;
    out.append(trim(m.content)).append("<end_of_turn>\n");
  }
  if (gen) out += "<start_of_turn>model\n";
  return out;
}

std::string llama2(const ChatTokens& tok, const std::vector<ChatMessage>& messages) {
  std::string out, system;
  size_t first = 0;
  if (!messages.empty() && messages.front().role == "system") {
    system = messages.front().content;
    first = 1;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string content = m.content;
    if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
    if (m.role == "assistant") {
      out.append(" ").append(trim(content)).append(" ").append(tok.eos);
    } else {
      if (i != first) out += tok.bos;
      out.append("[INST] ").append(trim(content)).append(" [/INST]");
    }
  }
  return out;
}

}  // namespace

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::None:
      return "none";
    case ChatFormat::Unrecognized:
      return "unrecognized";
    case ChatFormat::ChatMl:
      return "ChatML";
    case ChatFormat::Gemma:
      return "Gemma";
    case ChatFormat::Llama2:
      return "Llama-2";
  }
  return "?";
}

ChatTemplate chat_template_from_text(std::string_view text) {
  ChatTemplate t;
  if (text.empty()) return t;
  if (text.find("<|im_start|>") != std::string_view::npos) {
    t.format = ChatFormat::ChatMl;
    t.default_system = chatml_default_system(text);
  } else if (text.find("<start_of_turn>") != std::string_view::npos) {
    t.format = ChatFormat::Gemma;
  } else if (text.find("[INST]") != std::string_view::npos) {
    t.format = ChatFormat::Llama2;
  } else {
    t.format = ChatFormat::Unrecognized;
  }
  return t;
}

Expected<std::string> format_chat(const ChatTemplate& tmpl, const ChatTokens& tokens,
                                  const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) {
  switch (tmpl.format) {
    case ChatFormat::None:
      return make_error(
          "chat: this model has no chat template (the file has no tokenizer.chat_template: "
          "it is a base model, for plain text completion); run it without --chat");
    case ChatFormat::Unrecognized:
      return make_error(
          "chat: the file's chat template is of a family kvscope does not format (it knows "
          "ChatML, Gemma turns and Llama-2 [INST]); run it without --chat");
    case ChatFormat::ChatMl:
      return chatml(tmpl, messages, add_generation_prompt);
    case ChatFormat::Gemma:
      return gemma(messages, add_generation_prompt);
    case ChatFormat::Llama2:
      return llama2(tokens, messages);
  }
  return make_error("chat: unknown chat format");
}

}  // namespace kvscope
