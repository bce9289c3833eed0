// test_tokenizer.cpp — the default model's byte-level BPE tokenizer against llama.cpp's
// ids (tests/golden/tokenizer.json, made by scripts/make_golden.py), plus round trips,
// UTF-8 streaming, invalid input and the ChatML chat format. Tiny hand-worked
// vocabularies are in test_tokenizer_tiny.cpp, Gemma 3 in test_tokenizer_gemma.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/util/timing.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"

namespace kvscope {
namespace {

struct GoldenCase {
  std::string text;
  bool special = false;
  std::vector<int32_t> ids;
};

std::vector<GoldenCase> load_golden() {
  const std::string path = std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  std::vector<GoldenCase> out;
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    ADD_FAILURE() << path << ": not valid JSON";
    return out;
  }
  for (const auto& c : doc.at("cases")) {
    out.push_back(GoldenCase{c.at("text").get<std::string>(), c.at("special").get<bool>(),
                             c.at("ids").get<std::vector<int32_t>>()});
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
  EXPECT_EQ(tok_->model_name(), "gpt2");
  EXPECT_EQ(tok_->pre_name(), "smollm");
  // <|endoftext|> and <|im_end|> (the EOS) end a reply; <|im_start|> does not.
  EXPECT_EQ(tok_->eog_ids(), (std::vector<int32_t>{0, 2}));
  EXPECT_FALSE(tok_->is_eog(1));
  EXPECT_EQ(tok_->chat_template().format, ChatFormat::ChatMl);
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
  const double t0 = test::thread_cpu_ms();
  const auto ids = enc(text, true);
  const double ms = test::thread_cpu_ms() - t0;
  EXPECT_GE(ids.size(), 2000u);
  EXPECT_LT(ms, 100.0 * test::time_limit_scale()) << ids.size() << " tokens took " << ms << " ms";
  EXPECT_EQ(tok_->decode(ids), text);
}

TEST_F(TokenizerTest, LongWhitespaceRunStaysFast) {
  const std::string text = std::string(100000, ' ') + "x" + std::string(50000, '\n');
  const double t0 = test::thread_cpu_ms();
  const auto ids = enc(text, false);
  const double ms = test::thread_cpu_ms() - t0;
  EXPECT_EQ(tok_->decode(ids), text);
  EXPECT_LT(ms, 2000.0 * test::time_limit_scale());
}

}  // namespace
}  // namespace kvscope
