// tokenizer.h — the tokenizer interface, read from a GGUF file's tokenizer metadata.
//
// One Tokenizer per file, chosen by tokenizer.ggml.model:
//   "gpt2"  — byte-level BPE (tokenizer_bpe.cpp) with the pre-tokenizer named by
//             tokenizer.ggml.pre (smollm, qwen2, llama-bpe, gpt2/default);
//   "llama" — SentencePiece-style, score-ordered merges with byte fallback
//             (tokenizer_spm.cpp): Gemma, Llama 2, Mistral, TinyLlama files.
// Anything else, or an unknown pre-tokenizer, is one clear error naming it.
//
// Shared by every model (tokenizer.cpp): the vocabulary tables, UTF-8 validation, the
// special-token partition (control and unknown tokens are cut out of the text only when
// parse_special is on, user-defined tokens always, longest text first), the
// end-of-generation set and the chat format (chat_format.h). A Tokenizer is immutable
// after loading; encode() keeps its scratch state local, so concurrent calls are safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat_format.h"
#include "engine/gguf.h"
#include "common/status.h"
#include "engine/utf8.h"

namespace kvscope {

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

// Token text -> id, an open-addressing table of ids built once at load: no copy of the
// texts, lookups by string_view without allocating (262,144 entries for Gemma).
class TokenIndex {
 public:
  // Indexes `tokens` (a later duplicate text wins). Lookups take the same texts.
  void build(const std::vector<std::string>& tokens);
  int32_t find(std::string_view text,
               const std::vector<std::string>& tokens) const;  // -1 if absent

 private:
  static uint64_t hash(std::string_view s);
  std::vector<int32_t> slots_;  // -1 = empty; size a power of two, at most half full
  uint64_t mask_ = 0;
};

// The vocabulary facts every tokenizer model shares, read once at load.
struct Vocab {
  std::vector<std::string> tokens;  // [V] text as stored in the file
  std::vector<TokenType> types;     // [V]
  TokenIndex index;                 // over `tokens`
  std::vector<int32_t> specials;    // control / unknown / user-defined ids, longest text first
  std::vector<int32_t> eog;         // ids that end generation, ascending
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  TokenType type(int32_t id) const { return types[static_cast<size_t>(id)]; }
  int32_t find(std::string_view text) const { return index.find(text, tokens); }  // -1 if absent
};

class Tokenizer {
 public:
  // Reads the tokenizer of `file`. Errors name the file, the key and the value.
  static Expected<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& file);
  virtual ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text to ids (no BOS: callers add bos_id() when add_bos()). Invalid UTF-8 in `text`
  // is an error naming the byte offset.
  Expected<std::vector<int32_t>> encode(std::string_view text, bool parse_special) const;
  // Raw bytes of one token (may be a partial UTF-8 sequence: stream them through
  // Utf8Stream). Control, unknown and user-defined tokens give their literal text
  // (e.g. "<|im_end|>"); out-of-range ids give "".
  virtual std::string token_bytes(int32_t id) const = 0;
  // Token text as stored in the vocabulary (byte-to-unicode mapped or with U+2581).
  const std::string& token_str(int32_t id) const;
  // The text of a whole sequence: token_bytes() concatenated, less the one leading space
  // a SentencePiece model with add_space_prefix put in front of the first piece.
  virtual std::string decode(const std::vector<int32_t>& ids) const;

  int32_t n_vocab() const { return vocab_.size(); }
  int32_t bos_id() const { return vocab_.bos; }  // -1 if absent
  int32_t eos_id() const { return vocab_.eos; }  // -1 if absent
  bool is_control(int32_t id) const;
  // True for the tokens that end a reply: EOS, end-of-turn markers (<end_of_turn>,
  // <|im_end|>, <|endoftext|>, <|eot_id|>, ...) and tokenizer.ggml.eot_token_id.
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return vocab_.eog; }
  bool add_bos() const { return vocab_.add_bos; }           // tokenizer.ggml.add_bos_token
  const std::string& model_name() const { return model_; }  // tokenizer.ggml.model
  const std::string& pre_name() const { return pre_; }      // tokenizer.ggml.pre

  // The chat format read from the file's template (chat_format.h).
  const ChatTemplate& chat_template() const { return chat_; }
  // The conversation in the file's chat format, ending with the reply prefix when
  // add_generation_prompt. An error when the file has no template (a base model), a
  // template kvscope does not know, or lacks the format's marker tokens.
  Expected<std::string> apply_chat_template(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt) const;

 protected:
  // A piece of the input after the special-token partition: a special token (id >= 0)
  // or raw text (id == -1, bytes [off, off + len) of the input).
  struct Fragment {
    int32_t id;
    size_t off, len;
  };
  Tokenizer() = default;
  // Appends the ids of every fragment of `text` (valid UTF-8) to `out`.
  virtual Status encode_fragments(std::string_view text, const std::vector<Fragment>& frags,
                                  std::vector<int32_t>& out) const = 0;

  Vocab vocab_;
  std::string model_, pre_;
  ChatTemplate chat_;
};

}  // namespace kvscope
