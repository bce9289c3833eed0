// tokenizer.cpp — byte-level BPE (GPT-2 style) built from GGUF tokenizer metadata.
//
// Encoding runs in three stages:
//   1. special-token partition: control / user-defined token texts are cut out of the
//      input, longest text first (user-defined ones always, control ones only when
//      parse_special is on), leaving raw-text fragments;
//   2. pre-tokenization: each fragment is split by the pre-tokenizer's regexes (PCRE2,
//      UTF + UCP so \p{L}/\p{N}/\s are real Unicode classes); every regex splits the
//      pieces left by the previous one, and text between matches stays a piece;
//   3. BPE per piece: one symbol per byte (its byte-to-unicode character), then the
//      adjacent pair of lowest merge rank (leftmost on ties) is merged until none is
//      left; a final symbol that is not a vocabulary token becomes its byte tokens
//      (bytes without a token of their own are dropped, matching llama.cpp).
// Merges work on interned symbol ids: vocabulary ids first, then ids >= n_vocab for
// merge operands that are not tokens themselves. Invariants after from_gguf(): every
// table is sized from the checked token count, the pair table only holds interned ids.
// The Tokenizer is immutable after loading; encode() keeps all scratch state local, so
// concurrent calls are safe.
#include "engine/tokenizer.h"

#include "engine/utf8.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <queue>

namespace kvscope {
namespace {

constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;

// The GPT-2 pattern. The trailing \s+ alternative keeps leftover whitespace as a piece,
// which is also what splitting implementations do with unmatched gaps.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3 pattern (case-insensitive contractions spelled out, 1-3 digit numbers).
constexpr const char* kLlama3Pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

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
      append_utf8(b.to_utf8[byte], cp);
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

// One merge rule seen from its left operand: right operand id -> (rank, result id).
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

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> tokens;  // [V] vocabulary text (byte-to-unicode mapped)
  std::vector<int32_t> types;       // [V] token type (1 normal, 3 control, ...)
  std::unordered_map<std::string, int32_t> text_to_id;  // vocabulary text -> id
  int32_t n_vocab = 0;
  int32_t n_symbols = 0;  // vocabulary ids plus interned non-token merge operands
  std::unordered_map<uint64_t, MergeInfo> merges;  // (left, right) symbol ids -> merge
  std::array<int32_t, 256> byte_symbol{};          // byte -> symbol id of its mapped char, -1 none
  std::array<int32_t, 256> byte_token{};           // byte -> vocabulary id, -1 if absent
  std::vector<int32_t> specials;                   // special token ids, longest text first
  std::vector<CodePtr> regexes;                    // applied in order
  bool ignore_merges = false;                      // whole piece in vocab -> one token (llama-bpe)
  int32_t bos = -1, eos = -1;
  bool add_bos = false;
  std::string pre;

  Status compile(const std::vector<const char*>& patterns);
  Status split(std::string_view text, MatchState& ms, std::vector<Span>& pieces) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
};

Status Tokenizer::Impl::compile(const std::vector<const char*>& patterns) {
  for (const char* p : patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
    if (!code) {
      return make_error("tokenizer: pre-tokenizer '", pre, "': regex does not compile at offset ",
                        static_cast<uint64_t>(err_off), ": ", pcre2_message(err));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if absent
    regexes.emplace_back(code);
  }
  return Status::Ok();
}

// Splits `text` (valid UTF-8) by every regex in turn. Pieces are spans of `text`.
Status Tokenizer::Impl::split(std::string_view text, MatchState& ms,
                              std::vector<Span>& pieces) const {
  pieces.assign(1, Span{0, text.size()});
  std::vector<Span> next;
  for (const CodePtr& re : regexes) {
    next.clear();
    for (const Span& sp : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + sp.off);
      size_t pos = 0, done = 0;
      while (pos < sp.len) {
        const int rc =
            pcre2_match(re.get(), subject, sp.len, pos, PCRE2_NO_UTF_CHECK, ms.md, ms.ctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          return make_error("tokenizer: pre-tokenizer '", pre, "' failed on a piece of ",
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
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const ByteMap& bm = byte_map();
  if (ignore_merges) {
    std::string mapped;
    for (char c : piece) mapped += bm.to_utf8[static_cast<uint8_t>(c)];
    if (auto it = text_to_id.find(mapped); it != text_to_id.end()) {
      out.push_back(it->second);
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
    syms[i] = Sym{byte_symbol[static_cast<uint8_t>(piece[i])], static_cast<uint32_t>(i), 1, i - 1,
                  i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
  auto try_push = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || syms[l].id < 0 || syms[r].id < 0) return;
    auto it = merges.find(pair_key(syms[l].id, syms[r].id));
    if (it != merges.end()) queue.push(Cand{it->second.rank, l, syms[l].id, syms[r].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) try_push(i, i + 1);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& l = syms[c.left];
    if (l.len == 0 || l.id != c.left_id || l.next < 0) continue;
    Sym& r = syms[l.next];
    if (r.id != c.right_id) continue;  // stale: a neighbour changed since it was queued
    l.id = merges.at(pair_key(c.left_id, c.right_id)).result;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    try_push(l.prev, c.left);
    try_push(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) {
    const Sym& s = syms[i];
    if (s.id >= 0 && s.id < n_vocab) {
      out.push_back(s.id);
      continue;
    }
    // Not a token: fall back to byte tokens. A byte the vocabulary has no token for is
    // dropped, as llama.cpp does (SmolLM2 lacks e.g. 0x04, 0x14 and bytes that never
    // occur in valid UTF-8 such as 0xC0); the model could not see it anyway.
    for (uint32_t k = 0; k < s.len; ++k) {
      const int32_t id = byte_token[static_cast<uint8_t>(piece[s.off + k])];
      if (id >= 0) out.push_back(id);
    }
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& file) {
  auto impl = std::make_unique<Impl>();
  Impl& t = *impl;
  const std::string where = "tokenizer (" + file.path() + "): ";

  auto model = file.get_string("tokenizer.ggml.model");
  if (!model) return make_error(where, model.error().message);
  if (*model != "gpt2") {
    return make_error(where, "tokenizer.ggml.model is '", *model,
                      "'; only 'gpt2' (byte-level BPE) is supported");
  }

  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return make_error(where, tokens.error().message);
  if (tokens->empty() ||
      tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2)) {
    return make_error(where, "tokenizer.ggml.tokens has ", static_cast<uint64_t>(tokens->size()),
                      " entries; allowed 1..", std::numeric_limits<int32_t>::max() / 2);
  }
  t.tokens = std::move(*tokens);
  t.n_vocab = static_cast<int32_t>(t.tokens.size());

  t.types.assign(t.tokens.size(), 1);
  if (file.find("tokenizer.ggml.token_type")) {
    auto types = file.get_int_array("tokenizer.ggml.token_type");
    if (!types) return make_error(where, types.error().message);
    if (types->size() != t.tokens.size()) {
      return make_error(where, "tokenizer.ggml.token_type has ",
                        static_cast<uint64_t>(types->size()), " entries but there are ", t.n_vocab,
                        " tokens");
    }
    for (size_t i = 0; i < types->size(); ++i) t.types[i] = static_cast<int32_t>((*types)[i]);
  }

  auto read_id = [&](const char* key, int32_t& dst) -> Status {
    if (!file.find(key)) return Status::Ok();
    auto v = file.get_int(key);
    if (!v) return make_error(where, v.error().message);
    if (*v < 0 || *v >= t.n_vocab) {
      return make_error(where, key, " = ", *v, " is outside the vocabulary 0..", t.n_vocab - 1);
    }
    dst = static_cast<int32_t>(*v);
    return Status::Ok();
  };
  KV_TRY(read_id("tokenizer.ggml.bos_token_id", t.bos));
  KV_TRY(read_id("tokenizer.ggml.eos_token_id", t.eos));

  t.pre = "default";
  if (file.find("tokenizer.ggml.pre")) {
    auto pre = file.get_string("tokenizer.ggml.pre");
    if (!pre) return make_error(where, pre.error().message);
    t.pre = *pre;
  }
  // "smollm" first isolates every \p{N} character (any Unicode number, as llama.cpp
  // does, not only ASCII digits). "default" gets the plain GPT-2 pattern here; llama.cpp
  // uses a different multi-regex split for that name, so non-smollm files are untested.
  if (t.pre == "smollm") {
    KV_TRY(t.compile({R"(\p{N})", kGpt2Pattern}));
  } else if (t.pre == "gpt2" || t.pre == "gpt-2" || t.pre == "default") {
    KV_TRY(t.compile({kGpt2Pattern}));
  } else if (t.pre == "llama-bpe" || t.pre == "llama3" || t.pre == "llama-v3") {
    KV_TRY(t.compile({kLlama3Pattern}));
    t.ignore_merges = true;
    t.add_bos = true;
  } else {
    return make_error(where, "unsupported pre-tokenizer '", t.pre,
                      "' (tokenizer.ggml.pre); supported: smollm, gpt2, gpt-2, default, "
                      "llama-bpe, llama3, llama-v3");
  }
  if (file.find("tokenizer.ggml.add_bos_token")) {
    auto v = file.get_bool("tokenizer.ggml.add_bos_token");
    if (!v) return make_error(where, v.error().message);
    t.add_bos = *v;
  }

  // Symbol table: vocabulary ids (a later duplicate text wins), then interned extras.
  t.text_to_id.reserve(t.tokens.size() * 2);
  for (int32_t i = 0; i < t.n_vocab; ++i) t.text_to_id[t.tokens[i]] = i;
  std::unordered_map<std::string, int32_t> extra;
  t.n_symbols = t.n_vocab;
  auto intern = [&](const std::string& s) -> int32_t {
    if (auto it = t.text_to_id.find(s); it != t.text_to_id.end()) return it->second;
    auto [it, inserted] = extra.emplace(s, t.n_symbols);
    if (inserted) ++t.n_symbols;
    return it->second;
  };

  auto merges = file.get_string_array("tokenizer.ggml.merges");
  if (!merges) return make_error(where, merges.error().message);
  if (merges->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2)) {
    return make_error(where, "tokenizer.ggml.merges has too many entries (",
                      static_cast<uint64_t>(merges->size()), ")");
  }
  t.merges.reserve(merges->size() * 2);
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string& m = (*merges)[rank];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sp == std::string::npos || sp + 1 >= m.size()) {
      return make_error(where, "tokenizer.ggml.merges[", static_cast<uint64_t>(rank), "] = '", m,
                        "' is not of the form 'LEFT RIGHT'");
    }
    const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
    const int32_t a = intern(left), b = intern(right), ab = intern(left + right);
    t.merges.emplace(pair_key(a, b), MergeInfo{static_cast<int32_t>(rank), ab});  // first wins
  }

  const ByteMap& bm = byte_map();
  for (int b = 0; b < 256; ++b) {
    auto it = t.text_to_id.find(bm.to_utf8[b]);
    t.byte_token[b] = it == t.text_to_id.end() ? -1 : it->second;
    auto ex = extra.find(bm.to_utf8[b]);
    t.byte_symbol[b] = t.byte_token[b] >= 0 ? t.byte_token[b] : ex != extra.end() ? ex->second : -1;
  }

  for (int32_t i = 0; i < t.n_vocab; ++i) {
    const int32_t ty = t.types[i];
    if ((ty == kTypeControl || ty == kTypeUserDefined || ty == kTypeUnknown) &&
        !t.tokens[i].empty()) {
      t.specials.push_back(i);
    }
  }
  std::stable_sort(t.specials.begin(), t.specials.end(),
                   [&](int32_t a, int32_t b) { return t.tokens[a].size() > t.tokens[b].size(); });

  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& t = *impl_;
  size_t bad = 0;
  if (!utf8_valid(text, &bad)) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<uint8_t>(text[bad]));
    return make_error("tokenizer: input is not valid UTF-8 at byte offset ",
                      static_cast<uint64_t>(bad), " (byte ", hex, ")");
  }
  // Fragments: either a special token (id >= 0) or raw text (id == -1).
  struct Frag {
    int32_t id;
    size_t off, len;
  };
  std::vector<Frag> frags{Frag{-1, 0, text.size()}};
  std::vector<Frag> next;
  for (int32_t sid : t.specials) {
    const int32_t ty = t.types[sid];
    if (!parse_special && (ty == kTypeControl || ty == kTypeUnknown)) continue;
    const std::string& st = t.tokens[sid];
    next.clear();
    for (const Frag& f : frags) {
      if (f.id >= 0 || f.len < st.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.off, f.len);
      size_t pos = 0;
      for (size_t hit; (hit = raw.find(st, pos)) != std::string_view::npos; pos = hit + st.size()) {
        if (hit > pos) next.push_back(Frag{-1, f.off + pos, hit - pos});
        next.push_back(Frag{sid, 0, 0});
      }
      if (pos < f.len) next.push_back(Frag{-1, f.off + pos, f.len - pos});
    }
    frags.swap(next);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  MatchState ms;
  if (!ms.md || !ms.ctx) return make_error("tokenizer: out of memory for regex match state");
  std::vector<Span> pieces;
  for (const Frag& f : frags) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      continue;
    }
    const std::string_view raw = text.substr(f.off, f.len);
    KV_TRY(t.split(raw, ms, pieces));
    for (const Span& p : pieces) t.bpe(raw.substr(p.off, p.len), ids);
  }
  return ids;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= t.n_vocab) return {};
  const std::string& s = t.tokens[id];
  const int32_t ty = t.types[id];
  if (ty == kTypeControl || ty == kTypeUserDefined || ty == kTypeUnknown) return s;
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

const std::string& Tokenizer::token_str(int32_t id) const {
  static const std::string empty;
  if (id < 0 || id >= impl_->n_vocab) return empty;
  return impl_->tokens[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

int32_t Tokenizer::n_vocab() const {
  return impl_->n_vocab;
}
int32_t Tokenizer::bos_id() const {
  return impl_->bos;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < impl_->n_vocab && impl_->types[id] == kTypeControl;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
const std::string& Tokenizer::pre_name() const {
  return impl_->pre;
}

Expected<std::string> Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                                     bool add_generation_prompt) const {
  static constexpr const char* kStart = "<|im_start|>";
  static constexpr const char* kEnd = "<|im_end|>";
  for (const char* marker : {kStart, kEnd}) {
    if (!impl_->text_to_id.count(marker)) {
      return make_error("tokenizer: chat template needs the token ", marker,
                        " but the vocabulary has none");
    }
  }
  std::string out;
  auto turn = [&](std::string_view role, std::string_view content) {
    out += kStart;
    out += role;
    out += '\n';
    out += content;
    out += kEnd;
    out += '\n';
  };
  // As the model's own template: a default system turn before a first non-system message.
  if (!messages.empty() && messages.front().role != "system") {
    turn("system", "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  }
  for (const ChatMessage& m : messages) turn(m.role, m.content);
  if (add_generation_prompt) {
    out += kStart;
    out += "assistant\n";
  }
  return out;
}

}  // namespace kvscope
