// tokenizer_bpe.cpp — byte-level BPE (GPT-2 style, tokenizer.ggml.model "gpt2").
//
// After the shared special-token partition, each raw-text fragment goes through:
//   1. pre-tokenization: the fragment is split by the pre-tokenizer's regexes (PCRE2,
//      UTF + UCP so \p{L}/\p{N}/\s are real Unicode classes); every regex splits the
//      pieces left by the previous one, and text between matches stays a piece;
//   2. BPE per piece: one symbol per byte (its byte-to-unicode character), then the
//      adjacent pair of lowest merge rank (leftmost on ties) is merged until none is
//      left; a final symbol that is not a vocabulary token becomes its byte tokens
//      (bytes without a token of their own are dropped, matching llama.cpp).
// Pre-tokenizers (tokenizer.ggml.pre): "smollm" (every \p{N} isolated, then GPT-2),
// "qwen2" (the Llama 3 pattern with single digits), "llama-bpe" (Llama 3: 1-3 digit
// numbers, whole pieces found in the vocabulary skip the merges, BOS by default) and
// "gpt2"/"default" (the GPT-2 pattern). Any other name is an error naming it.
// Merges work on interned symbol ids: vocabulary ids first, then ids >= n_vocab for
// merge operands that are not tokens themselves; the pair table only holds interned ids.
#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <unordered_map>

#include "engine/printable.h"
#include "engine/tokenizer_models.h"
#include "engine/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace kvscope {
namespace {

// The GPT-2 pattern. The trailing \s+ alternative keeps leftover whitespace as a piece,
// which is also what splitting implementations do with unmatched gaps.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 pattern (case-insensitive contractions spelled out, 1-3 digit numbers).
constexpr const char* kLlama3Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2 pattern: the Llama 3 one with single digits.
constexpr const char* kQwen2Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kSupportedPre =
    "smollm, qwen2, llama-bpe, llama3, llama-v3, gpt2, gpt-2, default";

// GPT-2 byte-to-unicode map: printable bytes keep their code point, the other 68 bytes
// (ascending) take U+0100, U+0101, ...
struct ByteMap {
  std::array<std::string, 256> to_utf8;  // byte -> UTF-8 of its mapped code point
  std::array<int16_t, 0x144> from_cp;    // mapped code point -> byte, -1 if none
};

const ByteMap& byte_map() {
  static const ByteMap m = [] {
    ByteMap b;
    b.from_cp.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const bool keep = (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
                        (byte >= 0xAE && byte <= 0xFF);
      const uint32_t cp = keep ? byte : next++;
      utf8_append(b.to_utf8[byte], cp);
      b.from_cp[cp] = static_cast<int16_t>(byte);
    }
    return b;
  }();
  return m;
}

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;

struct Span {
  size_t off, len;
};

// One merge rule: (left, right) symbol ids -> rank and result symbol id.
struct MergeInfo {
  int32_t rank;
  int32_t result;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Per-call PCRE2 state (match data, JIT stack); owned by one encode() call.
struct MatchState {
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_data* md = nullptr;
  MatchState() {
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    md = pcre2_match_data_create(4, nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchState() {
    if (md) pcre2_match_data_free(md);
    if (stack) pcre2_jit_stack_free(stack);
    if (ctx) pcre2_match_context_free(ctx);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return "error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf));
}

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(Vocab v) { vocab_ = std::move(v); }
  Status load(const GgufFile& file, const std::string& where);
  std::string token_bytes(int32_t id) const override;

 protected:
  Status encode_fragments(std::string_view text, const std::vector<Fragment>& frags,
                          std::vector<int32_t>& out) const override;

 private:
  Status compile(const std::string& where, const std::vector<const char*>& patterns);
  Status split(std::string_view text, MatchState& ms, std::vector<Span>& pieces) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::unordered_map<uint64_t, MergeInfo> merges_;  // (left, right) symbol ids -> merge
  std::array<int32_t, 256> byte_symbol_{};          // byte -> symbol id of its mapped char, -1 none
  std::array<int32_t, 256> byte_token_{};           // byte -> vocabulary id, -1 if absent
  std::vector<CodePtr> regexes_;                    // applied in order
  bool ignore_merges_ = false;                      // whole piece in vocab -> one token (llama-bpe)
};

Status BpeTokenizer::compile(const std::string& where, const std::vector<const char*>& patterns) {
  for (const char* p : patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (!code) {
      return make_error(where, "pre-tokenizer '", printable_name(pre_),
                        "': regex does not compile at offset ",
                        static_cast<uint64_t>(err_off), ": ", pcre2_message(err));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
    regexes_.emplace_back(code);
  }
  return Status::Ok();
}

Status BpeTokenizer::load(const GgufFile& file, const std::string& where) {
  pre_ = "default";
  if (file.find("tokenizer.ggml.pre")) {
    auto pre = file.get_string("tokenizer.ggml.pre");
    if (!pre) return make_error(where, pre.error().message);
    pre_ = *pre;
  }
  // "smollm" first isolates every \p{N} character (any Unicode number, as llama.cpp
  // does, not only ASCII digits). "default" gets the plain GPT-2 pattern here; llama.cpp
  // uses a different multi-regex split for that name, so such files are untested.
  if (pre_ == "smollm") {
    KV_TRY(compile(where, {R"(\p{N})", kGpt2Pattern}));
  } else if (pre_ == "qwen2") {
    KV_TRY(compile(where, {kQwen2Pattern}));
  } else if (pre_ == "gpt2" || pre_ == "gpt-2" || pre_ == "default") {
    KV_TRY(compile(where, {kGpt2Pattern}));
  } else if (pre_ == "llama-bpe" || pre_ == "llama3" || pre_ == "llama-v3") {
    KV_TRY(compile(where, {kLlama3Pattern}));
    ignore_merges_ = true;
    vocab_.add_bos = true;
  } else {
    return make_error(where, "pre-tokenizer '", printable_name(pre_),
                      "' (tokenizer.ggml.pre) is not supported; supported: ", kSupportedPre);
  }
  KV_TRY(read_optional_bool(file, where, "tokenizer.ggml.add_bos_token", vocab_.add_bos));

  // Symbol table: vocabulary ids, then interned extras.
  const int32_t n_vocab = vocab_.size();
  std::unordered_map<std::string, int32_t> extra;
  int32_t n_symbols = n_vocab;
  auto intern = [&](const std::string& s) -> int32_t {
    if (const int32_t id = vocab_.find(s); id >= 0) return id;
    auto [it, inserted] = extra.emplace(s, n_symbols);
    if (inserted) ++n_symbols;
    return it->second;
  };

  auto merges = file.get_string_array("tokenizer.ggml.merges");
  if (!merges) return make_error(where, merges.error().message);
  if (merges->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2)) {
    return make_error(where, "tokenizer.ggml.merges has too many entries (",
                      static_cast<uint64_t>(merges->size()), ")");
  }
  merges_.reserve(merges->size() * 2);
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& m = (*merges)[rank];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      return make_error(where, "tokenizer.ggml.merges[", static_cast<uint64_t>(rank), "] = '",
                        printable_name(m),
                        "' is not of the form 'LEFT RIGHT'");
    }
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const int32_t a = intern(left), b = intern(right), ab = intern(left + right);
    merges_.emplace(pair_key(a, b), MergeInfo{static_cast<int32_t>(rank), ab});  // first wins
  }

  const ByteMap& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    byte_token_[b] = vocab_.find(bm.to_utf8[b]);
    auto ex = extra.find(bm.to_utf8[b]);
    byte_symbol_[b] = byte_token_[b] >= 0 ? byte_token_[b] : ex != extra.end() ? ex->second : -1;
  }
  return Status::Ok();
}

// Splits `text` (valid UTF-8) by every regex in turn. Pieces are spans of `text`.
Status BpeTokenizer::split(std::string_view text, MatchState& ms, std::vector<Span>& pieces) const {
  pieces.assign(1, Span{0, text.size()});
  std::vector<Span> next;
  for (const CodePtr& re : regexes_) {
    next.clear();
    for (const Span& sp : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + sp.off);
      size_t pos = 0, done = 0;
      while (pos < sp.len) {
        const int rc =
            pcre2_match(re.get(), subject, sp.len, pos, PCRE2_NO_UTF_CHECK, ms.md, ms.ctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          return make_error("tokenizer: pre-tokenizer '", printable_name(pre_),
                            "' failed on a piece of ",
                            static_cast<uint64_t>(sp.len), " bytes: ", pcre2_message(rc));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.md);
        const size_t s = ov[0], e = ov[1];
        if (e <= s) {  // empty match: step over one character
          pos = s + 1;
          while (pos < sp.len && (static_cast<uint8_t>(text[sp.off + pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (s > done) next.push_back(Span{sp.off + done, s - done});
        next.push_back(Span{sp.off + s, e - s});
        done = pos = e;
      }
      if (done < sp.len) next.push_back(Span{sp.off + done, sp.len - done});
    }
    pieces.swap(next);
  }
  return Status::Ok();
}

// BPE over one pre-tokenized piece (raw bytes). Appends vocabulary ids to `out`.
void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const ByteMap& bm = byte_map();
  if (ignore_merges_) {
    std::string mapped;
    for (char c : piece) mapped += bm.to_utf8[static_cast<uint8_t>(c)];
    if (const int32_t id = vocab_.find(mapped); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Sym {
    int32_t id;         // symbol id, -1 if the byte's character is unknown
    uint32_t off, len;  // bytes of `piece`; len 0 = merged away
    int32_t prev, next;
  };
  struct Cand {
    int32_t rank, left, left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Sym> syms(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    syms[i] = Sym{byte_symbol_[static_cast<uint8_t>(piece[i])], static_cast<uint32_t>(i), 1, i - 1,
                  i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto try_push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    auto it = merges_.find(pair_key(syms[l].id, syms[r].id));
    if (it != merges_.end()) queue.push(Cand{it->second.rank, l, syms[l].id, syms[r].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_push(i, i + 1);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& l = syms[c.left];
    if (l.len == 0 || l.id != c.left_id || l.next < 0) continue;
    Sym& r = syms[l.next];
    if (r.id != c.right_id) continue;  // stale: a neighbour changed since it was queued
    l.id = merges_.at(pair_key(c.left_id, c.right_id)).result;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    try_push(l.prev, c.left);
    try_push(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) {
    const Sym& s = syms[i];
    if (s.id >= 0 && s.id < vocab_.size()) {
      out.push_back(s.id);
      continue;
    }
    // Not a token: fall back to byte tokens. A byte the vocabulary has no token for is
    // dropped, as llama.cpp does (SmolLM2 lacks e.g. 0x04, 0x14 and bytes that never
    // occur in valid UTF-8 such as 0xC0); the model could not see it anyway.
    for (uint32_t k = 0; k < s.len; ++k) {
      const int32_t id = byte_token_[static_cast<uint8_t>(piece[s.off + k])];
      if (id >= 0) out.push_back(id);
    }
  }
}

Status BpeTokenizer::encode_fragments(std::string_view text, const std::vector<Fragment>& frags,
                                      std::vector<int32_t>& out) const {
  MatchState ms;
  if (!ms.md || !ms.ctx) return make_error("tokenizer: out of memory for regex match state");
  std::vector<Span> pieces;
  for (const Fragment& f : frags) {
    if (f.id >= 0) {
      out.push_back(f.id);
      continue;
    }
    const std::string_view raw = text.substr(f.off, f.len);
    KV_TRY(split(raw, ms, pieces));
    for (const Span& p : pieces) bpe(raw.substr(p.off, p.len), out);
  }
  return Status::Ok();
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return {};
  const std::string& s = vocab_.tokens[static_cast<size_t>(id)];
  const TokenType ty = vocab_.type(id);
  if (ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown)
    return s;
  const ByteMap& bm = byte_map();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Seq q = classify_utf8(s, i);
    if (q.kind != Utf8SeqKind::Valid) {  // malformed vocabulary text: pass bytes through
      out.append(s, i, q.len);
      i += q.len;
      continue;
    }
    uint32_t cp = static_cast<uint8_t>(s[i]);
    if (q.len > 1) {
      cp &= 0xFFu >> (q.len + 1);
      for (size_t k = 1; k < q.len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    }
    if (cp < bm.from_cp.size() && bm.from_cp[cp] >= 0) {
      out += static_cast<char>(bm.from_cp[cp]);
    } else {
      out.append(s, i, q.len);  // not a byte-level character: keep as is
    }
    i += q.len;
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(const GgufFile& file,
                                                        const std::string& where, Vocab vocab) {
  auto t = std::make_unique<BpeTokenizer>(std::move(vocab));
  KV_TRY(t->load(file, where));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace kvscope
