// test_tokenizer_gemma.cpp — the SentencePiece-style tokenizer on the Gemma 3 270M file
// against llama.cpp's ids (tests/golden/tokenizer_gemma3.json, made by
// scripts/make_golden_tokenizer.py), the checked id lists of docs/engine.md, decoding,
// byte tokens through the UTF-8 stream, end-of-generation ids and the missing chat
// template. Skipped when the Gemma file is not fetched (scripts/fetch_model.sh gemma3-270m).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "tests/util/timing.h"
#include "tests/util/model_fixture.h"

namespace kvscope {
namespace {

using Ids = std::vector<int32_t>;
const std::string kGemmaPath = GemmaModelFile::path();

struct GoldenCase {
  std::string text;
  bool special = false;
  Ids ids;  // BOS first
  std::string text_back;
};

std::vector<GoldenCase> load_golden() {
  const std::string path = std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/tokenizer_gemma3.json";
  std::ifstream in(path, std::ios::binary);
  std::vector<GoldenCase> out;
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    ADD_FAILURE() << path << ": not valid JSON";
    return out;
  }
  for (const auto& c : doc.at("cases")) {
    out.push_back(GoldenCase{c.at("text").get<std::string>(), c.at("special").get<bool>(),
                             c.at("ids").get<Ids>(), c.at("text_back").get<std::string>()});
  }
  return out;
}

std::string ids_str(const Ids& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

class GemmaTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kGemmaPath)) return;
    auto file = GgufFile::open(kGemmaPath);
    ASSERT_TRUE(file.ok()) << file.error().message;
    const double t0 = test::thread_cpu_ms();  // this thread's time: other processes do not count
    auto tok = Tokenizer::from_gguf(**file);
    load_ms_ = test::thread_cpu_ms() - t0;
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
    if (!tok_) GTEST_SKIP() << "Gemma 3 270M not found at " << kGemmaPath;
  }
  // What a prompt becomes: BOS (the file asks for it) then the text's ids.
  static Ids with_bos(std::string_view text, bool special) {
    auto r = tok_->encode(text, special);
    EXPECT_TRUE(r.ok()) << r.error().message;
    Ids ids;
    if (tok_->add_bos()) ids.push_back(tok_->bos_id());
    if (r.ok()) ids.insert(ids.end(), r->begin(), r->end());
    return ids;
  }
  static inline Tokenizer* tok_ = nullptr;
  static inline GgufFile* file_ = nullptr;
  static inline double load_ms_ = 0;
};

TEST_F(GemmaTokenizer, VocabularyFacts) {
  EXPECT_EQ(tok_->model_name(), "llama");
  EXPECT_EQ(tok_->n_vocab(), 262144);
  EXPECT_EQ(tok_->bos_id(), 2);
  EXPECT_EQ(tok_->eos_id(), 1);
  EXPECT_TRUE(tok_->add_bos());
  EXPECT_TRUE(tok_->is_control(106));
  EXPECT_EQ(tok_->token_bytes(106), "<end_of_turn>");
  EXPECT_EQ(tok_->token_bytes(107), "\n");           // user-defined
  EXPECT_EQ(tok_->token_bytes(238 + 0xF0), "\xF0");  // byte token <0xF0>
  EXPECT_EQ(tok_->token_bytes(9259), "Hello");
  EXPECT_EQ(tok_->token_bytes(1902), " world");  // '▁' decodes to a space
  // 262,144 entries indexed once at load, on this thread: a few tens of ms of CPU here; the
  // bound catches a quadratic index, not a slow machine (tests/util/timing.h).
  EXPECT_LT(load_ms_, 2000.0 * test::time_limit_scale());
}

TEST_F(GemmaTokenizer, CheckedIdsFromModelFamilies) {
  EXPECT_EQ(with_bos("Hello  world\n\nfoo\tbar", false),
            (Ids{2, 9259, 138, 12392, 108, 26537, 255968, 2230}));
  EXPECT_EQ(with_bos("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", true),
            (Ids{2, 105, 2364, 107, 10979, 993, 106, 107, 105, 4368, 107}));
  EXPECT_EQ(with_bos("\xF0\x9D\x94\x98", false), (Ids{2, 478, 395, 386, 390}));  // 𝔘
  EXPECT_EQ(with_bos("The capital of France is", false), (Ids{2, 818, 5279, 529, 7001, 563}));
}

TEST_F(GemmaTokenizer, MatchesLlamaCppOnGoldenStrings) {
  const auto cases = load_golden();
  ASSERT_GE(cases.size(), 60u);
  int failures = 0, special = 0;
  for (const GoldenCase& c : cases) {
    const Ids ids = with_bos(c.text, c.special);
    EXPECT_EQ(ids, c.ids) << "text: \"" << c.text << "\" special=" << c.special
                          << "\n  got:  " << ids_str(ids) << "\n  want: " << ids_str(c.ids);
    failures += ids != c.ids;
    special += c.special;
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GE(special, 5);
}

TEST_F(GemmaTokenizer, DecodeGivesWhatLlamaCppDecodes) {
  // Control tokens are written out, '▁' becomes a space, byte tokens their bytes: the
  // text llama.cpp's detokenizer gives. With add_space_prefix false and a token for
  // every byte, that is the input itself unless the input held a '▁' of its own.
  int lossy = 0;
  for (const GoldenCase& c : load_golden()) {
    const Ids body(c.ids.begin() + 1, c.ids.end());
    const std::string text = tok_->decode(body);
    EXPECT_EQ(text, c.text_back) << "text: \"" << c.text << "\"";
    if (c.text.find("\xE2\x96\x81") != std::string::npos) {
      ++lossy;
      continue;
    }
    EXPECT_EQ(text, c.text);
  }
  EXPECT_EQ(lossy, 1);
}

TEST_F(GemmaTokenizer, ByteTokensStreamAsWholeCharacters) {
  const Ids ids = with_bos("A \xF0\x9D\x94\x98 and \xF0\x9F\x98\x80!", false);
  Utf8Stream st;
  std::string out;
  int byte_tokens = 0, silent = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    const std::string bytes = tok_->token_bytes(ids[i]);
    byte_tokens += bytes.size() == 1 && static_cast<uint8_t>(bytes[0]) >= 0x80;
    const std::string piece = st.push(bytes);
    EXPECT_TRUE(utf8_valid(piece)) << "emitted half a character";
    silent += piece.empty();
    out += piece;
  }
  EXPECT_FALSE(st.holding());
  EXPECT_EQ(out, "A \xF0\x9D\x94\x98 and \xF0\x9F\x98\x80!");
  EXPECT_GE(byte_tokens, 4);  // 𝔘 is four byte tokens
  EXPECT_GE(silent, 3);       // held until the character completed
}

TEST_F(GemmaTokenizer, EndOfGenerationAndNoChatTemplate) {
  EXPECT_EQ(tok_->eog_ids(), (Ids{1, 106}));  // <eos>, <end_of_turn>
  EXPECT_FALSE(tok_->is_eog(2));
  EXPECT_FALSE(tok_->is_eog(105));
  // The 270M file is the base model: no template, so chat is refused with a reason.
  EXPECT_EQ(tok_->chat_template().format, ChatFormat::None);
  auto chat = tok_->apply_chat_template({{"user", "Hi"}}, true);
  ASSERT_FALSE(chat.ok());
  EXPECT_NE(chat.error().message.find("no chat template"), std::string::npos)
      << chat.error().message;
}

TEST_F(GemmaTokenizer, LongInputWithThousandsOfSpecialTokensStaysFast) {
  std::string text;
  const std::string para =
      "<start_of_turn>user\nIn the kingdom by the sea, 1,234 sailors counted 56789 stars; "
      "<b>naïve</b> cafés served 日本茶 and 😀 emoji.\n    def f(x):\n\treturn x * 2<end_of_turn>\n";
  while (text.size() < 9000) text += para;
  const double t0 = test::thread_cpu_ms();
  const Ids ids = with_bos(text, true);
  const double ms = test::thread_cpu_ms() - t0;
  EXPECT_GE(ids.size(), 2000u);
  EXPECT_LT(ms, 500.0 * test::time_limit_scale()) << ids.size() << " tokens took " << ms << " ms";
  EXPECT_EQ(tok_->decode(Ids(ids.begin() + 1, ids.end())), text);
}

}  // namespace
}  // namespace kvscope
