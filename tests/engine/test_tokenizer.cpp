// test_tokenizer.cpp — the BPE tokenizer against llama.cpp's ids (tests/golden/
// tokenizer.json, made by scripts/make_golden.py), plus round trips, UTF-8 streaming,
// invalid input, the chat template and unsupported pre-tokenizers.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "tests/util/gguf_writer.h"

namespace kvscope {
namespace {

// Just enough JSON to read the golden file: objects, arrays, strings (with \u escapes
// and surrogate pairs), numbers, booleans, null.
namespace testjson {
struct Value {
  enum class Kind { Null, Bool, Num, Str, Arr, Obj } kind = Kind::Null;
  bool boolean = false;
  double num = 0;
  std::string str;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;
  const Value& at(std::string_view key) const {
    static const Value none;
    for (const auto& [k, v] : object)
      if (k == key) return v;
    ADD_FAILURE() << "json: missing key " << key;
    return none;
  }
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}
  Expected<Value> document() {
    Value v;
    if (!value(v)) return make_error("json: bad input near byte ", static_cast<uint64_t>(i_));
    return v;
  }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  bool lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool hex4(uint32_t& cp) {
    if (i_ + 4 > s_.size()) return false;
    cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      cp <<= 4;
      if (c >= '0' && c <= '9')
        cp |= c - '0';
      else if (c >= 'a' && c <= 'f')
        cp |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        cp |= c - 'A' + 10;
      else
        return false;
    }
    return true;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  bool string(std::string& out) {
    if (!lit("\"")) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] != '\\') {
        out += s_[i_++];
        continue;
      }
      if (++i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          uint32_t cp = 0, lo = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!lit("\\u") || !hex4(lo)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default:
          out += e;
      }
    }
    return lit("\"");
  }
  bool value(Value& v) {
    ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Value::Kind::Obj;
      ws();
      if (lit("}")) return true;
      do {
        ws();
        std::string key;
        Value item;
        if (!string(key)) return false;
        ws();
        if (!lit(":") || !value(item)) return false;
        v.object.emplace_back(std::move(key), std::move(item));
        ws();
      } while (lit(","));
      return lit("}");
    }
    if (c == '[') {
      ++i_;
      v.kind = Value::Kind::Arr;
      ws();
      if (lit("]")) return true;
      do {
        Value item;
        if (!value(item)) return false;
        v.array.push_back(std::move(item));
        ws();
      } while (lit(","));
      return lit("]");
    }
    if (c == '"') {
      v.kind = Value::Kind::Str;
      return string(v.str);
    }
    if (lit("true")) return v.kind = Value::Kind::Bool, v.boolean = true, true;
    if (lit("false")) return v.kind = Value::Kind::Bool, true;
    if (lit("null")) return true;
    size_t used = 0;
    try {
      v.num = std::stod(std::string(s_.substr(i_, 40)), &used);
    } catch (...) {
      return false;
    }
    v.kind = Value::Kind::Num;
    i_ += used;
    return true;
  }
  std::string_view s_;
  size_t i_ = 0;
};

Expected<Value> parse(std::string_view s) {
  return Parser(s).document();
}
}  // namespace testjson

struct GoldenCase {
  std::string text;
  bool special = false;
  std::vector<int32_t> ids;
};

std::vector<GoldenCase> load_golden() {
  const std::string path = std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  auto doc = testjson::parse(ss.str());
  std::vector<GoldenCase> out;
  if (!doc) {
    ADD_FAILURE() << path << ": " << doc.error().message;
    return out;
  }
  for (const testjson::Value& c : doc->at("cases").array) {
    GoldenCase g;
    g.text = c.at("text").str;
    g.special = c.at("special").boolean;
    for (const testjson::Value& id : c.at("ids").array)
      g.ids.push_back(static_cast<int32_t>(id.num));
    out.push_back(std::move(g));
  }
  return out;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) return;
    auto file = GgufFile::open(KVSCOPE_DEFAULT_MODEL);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto tok = Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = std::move(*tok).release();
    file_ = std::move(*file).release();
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    tok_ = nullptr;
    file_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "default model not found at " << KVSCOPE_DEFAULT_MODEL;
  }
  std::vector<int32_t> enc(std::string_view s, bool special) {
    auto r = tok_->encode(s, special);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? *r : std::vector<int32_t>{};
  }
  static inline Tokenizer* tok_ = nullptr;
  static inline GgufFile* file_ = nullptr;
};

std::string ids_str(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

TEST_F(TokenizerTest, VocabularyFacts) {
  EXPECT_EQ(tok_->n_vocab(), 49152);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_FALSE(tok_->add_bos());
  EXPECT_EQ(tok_->pre_name(), "smollm");
  EXPECT_TRUE(tok_->is_control(2));
  EXPECT_FALSE(tok_->is_control(198));
  EXPECT_EQ(tok_->token_bytes(2), "<|im_end|>");
  EXPECT_EQ(tok_->token_str(198), "\xC4\x8A");  // 'Ċ' is the mapped newline
  EXPECT_EQ(tok_->token_bytes(198), "\n");
  EXPECT_EQ(tok_->token_bytes(-1), "");
  EXPECT_EQ(tok_->token_bytes(tok_->n_vocab()), "");
}

TEST_F(TokenizerTest, MatchesLlamaCppOnGoldenStrings) {
  const auto cases = load_golden();
  ASSERT_GE(cases.size(), 60u);
  int failures = 0;
  for (const GoldenCase& c : cases) {
    const auto ids = enc(c.text, c.special);
    EXPECT_EQ(ids, c.ids) << "text: \"" << c.text << "\" special=" << c.special
                          << "\n  got:  " << ids_str(ids) << "\n  want: " << ids_str(c.ids);
    failures += ids != c.ids;
  }
  EXPECT_EQ(failures, 0);
}

// The input without the bytes the vocabulary has no single-byte token for (SmolLM2
// lacks a few control bytes); encoding drops exactly those, as llama.cpp does.
std::string representable(const Tokenizer& tok, std::string_view text) {
  bool has[256] = {};
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    const std::string b = tok.token_bytes(id);
    if (b.size() == 1 && !tok.is_control(id)) has[static_cast<uint8_t>(b[0])] = true;
  }
  std::string out;
  for (char c : text)
    if (has[static_cast<uint8_t>(c)]) out += c;
  return out;
}

TEST_F(TokenizerTest, DecodeInvertsEncode) {
  int lossy = 0;
  for (const GoldenCase& c : load_golden()) {
    const std::string want = representable(*tok_, c.text);
    lossy += want != c.text;
    for (bool special : {false, true}) {
      EXPECT_EQ(tok_->decode(enc(c.text, special)), want) << "special=" << special;
    }
  }
  EXPECT_EQ(lossy, 1) << "exactly one golden string holds bytes SmolLM2 cannot represent";
}

TEST_F(TokenizerTest, SpecialTokensOnlyWhenAsked) {
  EXPECT_EQ(enc("<|im_start|>", true), (std::vector<int32_t>{1}));
  const auto plain = enc("<|im_start|>", false);
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_FALSE(tok_->is_control(id));
}

TEST_F(TokenizerTest, RejectsInvalidUtf8WithOffset) {
  for (const auto& [text, offset] :
       std::vector<std::pair<std::string, size_t>>{{"abc\xC3(", 3},
                                                   {"\xFF", 0},
                                                   {"ok \xE2\x82", 3},
                                                   {"x\xED\xA0\x80", 1},
                                                   {"\xC0\xAF", 0},
                                                   {"caf\xC3\xA9 \xF4\x90\x80\x80", 6}}) {
    auto r = tok_->encode(text, false);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("offset " + std::to_string(offset)), std::string::npos)
        << r.error().message;
    size_t bad = 99;
    EXPECT_FALSE(utf8_valid(text, &bad));
    EXPECT_EQ(bad, offset);
  }
  EXPECT_TRUE(utf8_valid("caf\xC3\xA9 \xF0\x9F\x98\x80"));
}

// Every chunk a stream emits is whole characters, and together they are the input.
void expect_stream_whole(const std::vector<std::string>& chunks, const std::string& want) {
  Utf8Stream st;
  std::string all;
  for (const std::string& c : chunks) {
    const std::string out = st.push(c);
    EXPECT_TRUE(utf8_valid(out)) << "emitted half a character";
    all += out;
  }
  EXPECT_FALSE(st.holding());
  all += st.flush();
  EXPECT_EQ(all, want);
}

TEST_F(TokenizerTest, Utf8StreamNeverSplitsCharacters) {
  const std::string text = "Café 日本語 👨‍👩‍👧 😀 ½ naïve";
  const auto ids = enc(text, false);
  std::vector<std::string> by_token, by_byte;
  bool some_token_is_partial = false;
  for (int32_t id : ids) {
    by_token.push_back(tok_->token_bytes(id));
    some_token_is_partial |= !utf8_valid(by_token.back());
  }
  EXPECT_TRUE(some_token_is_partial) << "input should exercise tokens ending mid-character";
  for (char c : text) by_byte.emplace_back(1, c);
  expect_stream_whole(by_token, text);
  expect_stream_whole(by_byte, text);
}

TEST(Utf8Stream, HoldsIncompleteAndReplacesInvalid) {
  Utf8Stream st;
  EXPECT_EQ(st.push("a\xE6\x97"), "a");
  EXPECT_TRUE(st.holding());
  EXPECT_EQ(st.push("\xA5z"), "\xE6\x97\xA5z");
  EXPECT_EQ(st.push("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(st.push("\xE6\x97x"), "\xEF\xBF\xBDx");  // broken sequence: one U+FFFD
  EXPECT_EQ(st.push("\xF0\x9F"), "");
  EXPECT_EQ(st.flush(), "\xEF\xBF\xBD");
  EXPECT_FALSE(st.holding());
}

TEST_F(TokenizerTest, ChatTemplateIsChatMl) {
  auto text = tok_->apply_chat_template({{"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto own = tok_->apply_chat_template({{"system", "Be brief."}, {"user", "Hi"}}, false);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  const auto ids = enc(*text, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok_->bos_id());
}

TEST_F(TokenizerTest, LongPromptEncodesFast) {
  std::string text;
  const std::string para =
      "In the kingdom by the sea, 1,234 sailors counted 56789 stars; naïve cafés served "
      "日本茶 and 😀 emoji.\n    def f(x):\n\treturn x * 2  # code\n";
  while (text.size() < 9000) text += para;
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = enc(text, true);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ids.size(), 2000u);
  EXPECT_LT(ms, 100.0) << ids.size() << " tokens took " << ms << " ms";
  EXPECT_EQ(tok_->decode(ids), text);
}

TEST_F(TokenizerTest, LongWhitespaceRunStaysFast) {
  const std::string text = std::string(100000, ' ') + "x" + std::string(50000, '\n');
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = enc(text, false);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok_->decode(ids), text);
  EXPECT_LT(ms, 2000.0);
}

// A tiny byte-level vocabulary in a GGUF built in memory.
struct TinyVocab {
  std::string pre = "gpt2";
  bool with_merges = true;
  int64_t bos = 0;
};

Expected<std::unique_ptr<Tokenizer>> tiny_tokenizer(const TinyVocab& v) {
  test::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", v.pre);
  //                                0      1    2    3    4     5     6      7    8
  w.add_string_array("tokenizer.ggml.tokens",
                     {"<s>", "a", "b", "c", "ab", "bc", "abc", "aa", "\xC4\xA0"});
  w.add_i32_array("tokenizer.ggml.token_type", {3, 1, 1, 1, 1, 1, 1, 1, 1});
  if (v.with_merges) w.add_string_array("tokenizer.ggml.merges", {"b c", "a b", "a bc", "a a"});
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
  auto file = GgufFile::from_bytes(w.build(), "tiny.gguf");
  if (!file) return file.error();
  return Tokenizer::from_gguf(**file);
}

std::vector<int32_t> tiny_encode(const Tokenizer& t, std::string_view s) {
  auto r = t.encode(s, true);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : std::vector<int32_t>{};
}

TEST(TinyTokenizer, MergesByRankLeftmostFirst) {
  auto t = tiny_tokenizer({});
  ASSERT_TRUE(t.ok()) << t.error().message;
  using V = std::vector<int32_t>;
  EXPECT_EQ(tiny_encode(**t, "abc"), (V{6}));  // b+c (rank 0) first, then a+bc
  EXPECT_EQ(tiny_encode(**t, "ab"), (V{4}));
  EXPECT_EQ(tiny_encode(**t, "aaa"), (V{7, 1}));      // tie: leftmost pair merges
  EXPECT_EQ(tiny_encode(**t, "<s>abc"), (V{0, 6}));   // control token cut out
  EXPECT_EQ(tiny_encode(**t, "c ab"), (V{3, 8, 4}));  // ' ' + letters: ' ' maps to U+0120
  EXPECT_EQ(tiny_encode(**t, "abd"), (V{4}));         // 'd' has no token: dropped like llama.cpp
}

TEST(TinyTokenizer, LlamaBpeTakesWholeWordsFromTheVocabulary) {
  auto gpt2 = tiny_tokenizer({.pre = "gpt2", .with_merges = true});
  ASSERT_TRUE(gpt2.ok()) << gpt2.error().message;
  EXPECT_FALSE((*gpt2)->add_bos());
  auto llama = tiny_tokenizer({.pre = "llama-bpe"});
  ASSERT_TRUE(llama.ok()) << llama.error().message;
  EXPECT_TRUE((*llama)->add_bos());
  EXPECT_EQ(tiny_encode(**llama, "abc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(tiny_encode(**llama, "ca"), (std::vector<int32_t>{3, 1}));
}

TEST(TinyTokenizer, UnknownPreTokenizerIsAnErrorNamingIt) {
  auto t = tiny_tokenizer({.pre = "klingon"});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("'klingon'"), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("smollm"), std::string::npos) << t.error().message;
}

TEST(TinyTokenizer, BadMetadataIsAnError) {
  auto no_merges = tiny_tokenizer({.with_merges = false});
  ASSERT_FALSE(no_merges.ok());
  EXPECT_NE(no_merges.error().message.find("tokenizer.ggml.merges"), std::string::npos)
      << no_merges.error().message;
  auto bad_bos = tiny_tokenizer({.bos = 9});
  ASSERT_FALSE(bad_bos.ok());
  EXPECT_NE(bad_bos.error().message.find("bos_token_id"), std::string::npos)
      << bad_bos.error().message;
}

}  // namespace
}  // namespace kvscope
