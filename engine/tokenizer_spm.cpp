// tokenizer_spm.cpp — SentencePiece-style tokenizer (tokenizer.ggml.model "llama"):
// Gemma, Llama 2, Mistral, TinyLlama files.
//
// After the shared special-token partition (user-defined tokens such as Gemma's newline,
// space and tab runs are always cut out), each raw-text fragment is encoded as:
//   1. a space in front when add_space_prefix and the fragment is the first or follows a
//      special token; then every ' ' becomes U+2581 '▁' (only spaces);
//   2. one symbol per UTF-8 character; repeatedly the adjacent pair whose concatenation
//      is a vocabulary entry with the highest score is merged (leftmost on equal
//      scores). There is no pre-tokenizer regex;
//   3. a final symbol that is not a vocabulary entry (always a single character) becomes
//      one byte token <0xXX> per UTF-8 byte (the single-byte entry, or UNK, where the
//      vocabulary has no byte tokens).
// Decoding: '▁' back to ' ' in normal tokens, byte tokens give their raw byte, control /
// unknown / user-defined tokens their text; decode() drops one leading space of the
// first piece when add_space_prefix. add_bos_token defaults to true, add_space_prefix
// to true. Lookups go through the vocabulary's hash map, built once at load.
#include <array>
#include <cstdio>
#include <queue>

#include "engine/tokenizer_models.h"

namespace kvscope {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte of a "<0xXX>" token text, -1 if the text is not of that form.
int byte_of(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = hex_digit(text[3]), lo = hex_digit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocab v) { vocab_ = std::move(v); }
  Status load(const GgufFile& file, const std::string& where);
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;

 protected:
  Status encode_fragments(std::string_view text, const std::vector<Fragment>& frags,
                          std::vector<int32_t>& out) const override;

 private:
  void merge(std::string_view text, std::vector<int32_t>& out) const;

  std::vector<float> scores_;              // [V] merge priority, higher first
  std::array<int32_t, 256> byte_token_{};  // byte -> its fallback token, -1 if none
  bool add_space_prefix_ = true;
};

Status SpmTokenizer::load(const GgufFile& file, const std::string& where) {
  pre_ = "default";  // SentencePiece models have no pre-tokenizer
  const size_t n = vocab_.tokens.size();
  scores_.assign(n, 0.0f);
  if (file.find("tokenizer.ggml.scores")) {
    auto scores = file.get_float_array("tokenizer.ggml.scores");
    if (!scores) return make_error(where, scores.error().message);
    if (scores->size() != n) {
      return make_error(where, "tokenizer.ggml.scores has ", static_cast<uint64_t>(scores->size()),
                        " entries but there are ", static_cast<uint64_t>(n), " tokens");
    }
    for (size_t i = 0; i < n; ++i) scores_[i] = static_cast<float>((*scores)[i]);
  }
  vocab_.add_bos = true;
  KV_TRY(read_optional_bool(file, where, "tokenizer.ggml.add_bos_token", vocab_.add_bos));
  KV_TRY(read_optional_bool(file, where, "tokenizer.ggml.add_space_prefix", add_space_prefix_));
  if (vocab_.add_bos && vocab_.bos < 0) {
    return make_error(where,
                      "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is "
                      "missing");
  }

  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = vocab_.find(hex);
    if (id < 0) id = vocab_.find(std::string(1, static_cast<char>(b)));
    byte_token_[static_cast<size_t>(b)] = id >= 0 ? id : vocab_.unk;
  }
  return Status::Ok();
}

// Score-ordered merges over the UTF-8 characters of `text` (already escaped).
void SpmTokenizer::merge(std::string_view text, std::vector<int32_t>& out) const {
  struct Sym {
    uint32_t off, len;  // bytes of `text`; len 0 = merged away
    int32_t prev, next;
  };
  struct Cand {
    float score;
    int32_t left, right;
    uint32_t len;  // bytes of the merged text: a stale candidate no longer matches
    bool operator<(const Cand& o) const {  // priority: higher score, then leftmost
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::vector<Sym> syms;
  syms.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = classify_utf8(text, off).len;  // valid input: the character's length
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back(Sym{static_cast<uint32_t>(off), static_cast<uint32_t>(len), i - 1,
                       off + len < text.size() ? i + 1 : -1});
    off += len;
  }
  std::priority_queue<Cand> queue;
  auto try_push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = syms[l].len + syms[r].len;
    const int32_t id = vocab_.find(text.substr(syms[l].off, len));
    if (id >= 0) queue.push(Cand{scores_[static_cast<size_t>(id)], l, r, len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) try_push(i, i + 1);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    try_push(l.prev, c.left);
    try_push(c.left, l.next);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].off, syms[i].len);
    if (const int32_t id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Merges only make vocabulary entries, so this is one character the vocabulary
    // lacks: its bytes.
    for (char b : piece) {
      const int32_t id = byte_token_[static_cast<uint8_t>(b)];
      if (id >= 0) out.push_back(id);
    }
  }
}

Status SpmTokenizer::encode_fragments(std::string_view text, const std::vector<Fragment>& frags,
                                      std::vector<int32_t>& out) const {
  bool after_special = true;  // the first fragment counts as following a special token
  std::string escaped;
  for (const Fragment& f : frags) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
      continue;
    }
    escaped.clear();
    if (add_space_prefix_ && after_special) escaped += kSpaceMark;
    for (char c : text.substr(f.off, f.len)) {
      if (c == ' ') {
        escaped += kSpaceMark;
      } else {
        escaped += c;
      }
    }
    merge(escaped, out);
    after_special = false;
  }
  return Status::Ok();
}

std::string SpmTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  const std::string& s = vocab_.tokens[static_cast<size_t>(id)];
  switch (vocab_.type(id)) {
    case TokenType::Normal: {
      std::string out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        if (s.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
          out += ' ';
          i += kSpaceMark.size();
        } else {
          out += s[i++];
        }
      }
      return out;
    }
    case TokenType::Byte: {
      const int b = byte_of(s);
      return b < 0 ? std::string() : std::string(1, static_cast<char>(b));
    }
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::UserDefined:
      return s;
    case TokenType::Undefined:
    case TokenType::Unused:
      break;
  }
  return {};
}

std::string SpmTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_bytes(ids[i]);
    if (i == 0 && add_space_prefix_ && !piece.empty() && piece.front() == ' ') piece.erase(0, 1);
    out += piece;
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> make_spm_tokenizer(const GgufFile& file,
                                                        const std::string& where, Vocab vocab) {
  auto t = std::make_unique<SpmTokenizer>(std::move(vocab));
  KV_TRY(t->load(file, where));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace kvscope
