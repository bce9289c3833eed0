// tokenizer.cpp — what every tokenizer model shares: reading the vocabulary, choosing
// the model, UTF-8 validation, the special-token partition, end-of-generation ids and
// the chat format. The models themselves are in tokenizer_bpe.cpp and tokenizer_spm.cpp.
//
// Invariants after from_gguf(): every table is sized from the checked token count;
// bos/eos/unk are -1 or inside the vocabulary; `specials` is sorted by text length,
// longest first (stable, so equal lengths keep id order).
#include "engine/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>

#include "engine/printable.h"
#include "engine/tokenizer_models.h"

namespace kvscope {
namespace {

// Token texts that end a reply in the families GGUF files come from (as llama.cpp's
// end-of-generation list), besides the file's EOS / EOT / EOM ids.
constexpr std::array<std::string_view, 9> kEndOfTurnTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>",      "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "<|end_of_text|>", "<end_of_utterance>",
};

bool is_special_type(TokenType t) {
  return t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
}

// Reads the vocabulary shared by every model: tokens, types, special ids, the special
// partition order and the end-of-generation set.
Status read_vocab(const GgufFile& file, const std::string& where, Vocab& v) {
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (!tokens) return make_error(where, "tokenizer.ggml.tokens is missing");
  auto list = file.get_string_array("tokenizer.ggml.tokens");
  if (!list) return make_error(where, list.error().message);
  constexpr size_t kMaxTokens = std::numeric_limits<int32_t>::max() / 2;
  if (list->empty() || list->size() > kMaxTokens) {
    return make_error(where, "tokenizer.ggml.tokens has ", static_cast<uint64_t>(list->size()),
                      " entries; allowed 1..", static_cast<uint64_t>(kMaxTokens));
  }
  v.tokens = std::move(*list);
  const int32_t n = v.size();

  v.types.assign(v.tokens.size(), TokenType::Normal);
  if (file.find("tokenizer.ggml.token_type")) {
    auto types = file.get_int_array("tokenizer.ggml.token_type");
    if (!types) return make_error(where, types.error().message);
    if (types->size() != v.tokens.size()) {
      return make_error(where, "tokenizer.ggml.token_type has ",
                        static_cast<uint64_t>(types->size()), " entries but there are ", n,
                        " tokens");
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const int64_t t = (*types)[i];
      // Values outside the known set behave as undefined (decoded to nothing).
      v.types[i] = t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::Undefined;
    }
  }

  v.index.build(v.tokens);

  auto read_id = [&](const char* key, int32_t& dst) -> Status {
    if (!file.find(key)) return Status::Ok();
    auto id = file.get_int(key);
    if (!id) return make_error(where, id.error().message);
    if (*id < 0 || *id >= n) {
      return make_error(where, key, " = ", *id, " is outside the vocabulary 0..", n - 1);
    }
    dst = static_cast<int32_t>(*id);
    return Status::Ok();
  };
  KV_TRY(read_id("tokenizer.ggml.bos_token_id", v.bos));
  KV_TRY(read_id("tokenizer.ggml.eos_token_id", v.eos));
  KV_TRY(read_id("tokenizer.ggml.unknown_token_id", v.unk));
  int32_t eot = -1, eom = -1;
  KV_TRY(read_id("tokenizer.ggml.eot_token_id", eot));
  KV_TRY(read_id("tokenizer.ggml.eom_token_id", eom));

  for (int32_t id : {v.eos, eot, eom})
    if (id >= 0) v.eog.push_back(id);
  for (std::string_view text : kEndOfTurnTexts)
    if (const int32_t id = v.find(text); id >= 0) v.eog.push_back(id);
  std::sort(v.eog.begin(), v.eog.end());
  v.eog.erase(std::unique(v.eog.begin(), v.eog.end()), v.eog.end());

  for (int32_t i = 0; i < n; ++i)
    if (is_special_type(v.type(i)) && !v.tokens[static_cast<size_t>(i)].empty())
      v.specials.push_back(i);
  std::stable_sort(v.specials.begin(), v.specials.end(), [&](int32_t a, int32_t b) {
    return v.tokens[static_cast<size_t>(a)].size() > v.tokens[static_cast<size_t>(b)].size();
  });
  return Status::Ok();
}

}  // namespace

uint64_t TokenIndex::hash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, then a final mix for the low bits
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h ^ (h >> 29);
}

void TokenIndex::build(const std::vector<std::string>& tokens) {
  size_t cap = 16;
  while (cap < tokens.size() * 2) cap *= 2;
  slots_.assign(cap, -1);
  mask_ = cap - 1;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string& text = tokens[id];
    for (uint64_t i = hash(text) & mask_;; i = (i + 1) & mask_) {
      int32_t& slot = slots_[i];
      if (slot < 0 || tokens[static_cast<size_t>(slot)] == text) {
        slot = static_cast<int32_t>(id);
        break;
      }
    }
  }
}

int32_t TokenIndex::find(std::string_view text, const std::vector<std::string>& tokens) const {
  if (slots_.empty()) return -1;
  for (uint64_t i = hash(text) & mask_;; i = (i + 1) & mask_) {
    const int32_t slot = slots_[i];
    if (slot < 0) return -1;
    if (tokens[static_cast<size_t>(slot)] == text) return slot;
  }
}

Status read_optional_bool(const GgufFile& file, const std::string& where, const char* key,
                          bool& dst) {
  if (!file.find(key)) return Status::Ok();
  auto v = file.get_bool(key);
  if (!v) return make_error(where, v.error().message);
  dst = *v;
  return Status::Ok();
}

Tokenizer::~Tokenizer() = default;

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
  const std::string where = "tokenizer (" + printable_name(file.path()) + "): ";
  auto model = file.get_string("tokenizer.ggml.model");
  if (!model) return make_error(where, model.error().message);
  if (*model != "gpt2" && *model != "llama") {
    return make_error(where, "tokenizer model '", printable_name(*model),
                      "' (tokenizer.ggml.model) is not supported; kvscope reads 'gpt2' "
                      "(byte-level BPE) and 'llama' (SentencePiece-style)");
  }
  Vocab vocab;
  KV_TRY(read_vocab(file, where, vocab));
  auto tok = *model == "gpt2" ? make_bpe_tokenizer(file, where, std::move(vocab))
                              : make_spm_tokenizer(file, where, std::move(vocab));
  if (!tok) return tok.error();
  Tokenizer& t = **tok;
  t.model_ = *model;

  std::string tmpl;
  if (file.find("tokenizer.chat_template")) {
    auto text = file.get_string("tokenizer.chat_template");
    if (!text) return make_error(where, text.error().message);
    tmpl = std::move(*text);
  }
  t.chat_ = chat_template_from_text(tmpl);
  return tok;
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool parse_special) const {
  size_t bad = 0;
  if (!utf8_valid(text, &bad)) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<uint8_t>(text[bad]));
    return make_error("tokenizer: input is not valid UTF-8 at byte offset ",
                      static_cast<uint64_t>(bad), " (byte ", hex, ")");
  }
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back(Fragment{-1, 0, text.size()});
  // Which bytes occur at all: most special tokens (thousands in some vocabularies) can
  // be skipped without searching.
  std::array<bool, 256> present{};
  for (char c : text) present[static_cast<uint8_t>(c)] = true;
  std::vector<Fragment> next;
  for (int32_t sid : vocab_.specials) {
    const TokenType ty = vocab_.type(sid);
    if (!parse_special && (ty == TokenType::Control || ty == TokenType::Unknown)) continue;
    const std::string& st = vocab_.tokens[static_cast<size_t>(sid)];
    if (!present[static_cast<uint8_t>(st[0])] || text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.id >= 0 || f.len < st.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.off, f.len);
      size_t pos = 0;
      for (size_t hit; (hit = raw.find(st, pos)) != std::string_view::npos; pos = hit + st.size()) {
        if (hit > pos) next.push_back(Fragment{-1, f.off + pos, hit - pos});
        next.push_back(Fragment{sid, 0, 0});
      }
      if (pos < f.len) next.push_back(Fragment{-1, f.off + pos, f.len - pos});
    }
    frags.swap(next);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  KV_TRY(encode_fragments(text, frags, ids));
  return ids;
}

const std::string& Tokenizer::token_str(int32_t id) const {
  static const std::string empty;
  if (id < 0 || id >= n_vocab()) return empty;
  return vocab_.tokens[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < n_vocab() && vocab_.type(id) == TokenType::Control;
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(vocab_.eog.begin(), vocab_.eog.end(), id);
}

Expected<std::string> Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                                     bool add_generation_prompt) const {
  std::vector<std::string_view> markers;
  if (chat_.format == ChatFormat::ChatMl) markers = {"<|im_start|>", "<|im_end|>"};
  if (chat_.format == ChatFormat::Gemma) markers = {"<start_of_turn>", "<end_of_turn>"};
  for (std::string_view m : markers) {
    if (vocab_.find(m) < 0) {
      return make_error("chat: the ", chat_format_name(chat_.format),
                        " chat format needs the token ", m, " but the vocabulary has none");
    }
  }
  ChatTokens tokens;
  if (chat_.format == ChatFormat::Llama2) {
    tokens.bos = token_str(vocab_.bos);
    tokens.eos = token_str(vocab_.eos);
  }
  return format_chat(chat_, tokens, messages, add_generation_prompt);
}

}  // namespace kvscope
