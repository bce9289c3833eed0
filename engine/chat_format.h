// chat_format.h — chat formats by model family, recognized from the file's template.
//
// kvscope does not run Jinja: it recognizes which family a file's tokenizer.chat_template
// belongs to and writes that family's turns itself.
//   ChatML  (SmolLM2, Qwen2): <|im_start|>{role}\n{content}<|im_end|>\n per message; the
//           template's default system message (if it has one) first when the
//           conversation has none; reply prefix <|im_start|>assistant\n.
//   Gemma:  <start_of_turn>{user|model}\n{content}<end_of_turn>\n; a system message is
//           merged into the first user turn ("{system}\n\n{user}"); reply prefix
//           <start_of_turn>model\n.
//   Llama2: [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] per user turn, " {reply} "
//           + EOS after each reply and BOS before each later user turn.
// No template (a base model) or one of another family: format_chat says so.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvscope {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFormat { None, Unrecognized, ChatMl, Gemma, Llama2 };
const char* chat_format_name(ChatFormat f);

struct ChatTemplate {
  ChatFormat format = ChatFormat::None;
  std::string default_system;  // ChatML: system text put first when none is given ("" = none)
};

// The family of a tokenizer.chat_template text ("" = the file has none).
ChatTemplate chat_template_from_text(std::string_view text);

// Special-token text the formats write between turns.
struct ChatTokens {
  std::string bos, eos;  // Llama2 only: written before later user turns / after replies
};

// The conversation as text for encode(..., parse_special = true). No leading BOS: the
// caller adds it when the tokenizer says add_bos.
Expected<std::string> format_chat(const ChatTemplate& tmpl, const ChatTokens& tokens,
                                  const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt);

}  // namespace kvscope
