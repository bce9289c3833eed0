// tokenizer.h — byte-level BPE tokenizer read from GGUF metadata.
//
// Supports tokenizer.ggml.model == "gpt2" with the pre-tokenizers named by
// tokenizer.ggml.pre that we implement ("smollm", and the plain GPT-2 pattern for
// "default"/"gpt2", "llama-bpe"); an unknown name is a clear error. Pre-tokenization uses
// PCRE2 with UTF and UCP so Unicode letter/number classes are real. Special tokens are
// cut out first, longest first: control tokens when parse_special is on, user-defined
// tokens always.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/gguf.h"
#include "engine/status.h"
#include "engine/utf8.h"

namespace kvscope {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  static Expected<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& file);
  ~Tokenizer();

  // Text to ids. Invalid UTF-8 in `text` is an error naming the byte offset.
  Expected<std::vector<int32_t>> encode(std::string_view text, bool parse_special) const;
  // Raw bytes of one token (byte-level decoded; may be a partial UTF-8 sequence).
  // Control tokens decode to their literal text (e.g. "<|im_end|>").
  std::string token_bytes(int32_t id) const;
  // Token text as stored in the vocabulary (byte-to-unicode mapped form).
  const std::string& token_str(int32_t id) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;  // -1 if absent
  int32_t eos_id() const;  // -1 if absent
  bool is_control(int32_t id) const;
  bool add_bos() const;    // tokenizer.ggml.add_bos_token
  const std::string& pre_name() const;

  // ChatML for instruct models: <|im_start|>{role}\n{content}<|im_end|>\n per message,
  // a default system turn when none is given, then <|im_start|>assistant\n when
  // add_generation_prompt. An error if the vocabulary has no <|im_start|>/<|im_end|>.
  Expected<std::string> apply_chat_template(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvscope
