// test_tokenizer_tiny.cpp — tokenizers of tiny vocabularies written as GGUFs by the test
// GGUF writer, each against ids worked out by hand: a GPT-2-style BPE vocabulary, a
// Qwen2-style one (pre-tokenizer "qwen2"), a Llama-2-style SentencePiece one (byte
// tokens, add_space_prefix, scores) and a Gemma-style one; their chat formats and
// end-of-generation ids; unknown tokenizer models and pre-tokenizers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "tests/util/gguf_writer.h"

namespace kvscope {
namespace {

using Ids = std::vector<int32_t>;

struct TinySpec {
  std::string model = "gpt2";
  std::optional<std::string> pre;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;  // empty: key absent
  std::optional<std::vector<std::string>> merges;
  int64_t bos = -1, eos = -1, unk = -1;  // -1: key absent
  std::optional<bool> add_bos, add_space_prefix;
  std::string chat_template;  // "": key absent
};

Expected<std::unique_ptr<Tokenizer>> build(const TinySpec& s) {
  test::GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("tokenizer.ggml.model", s.model);
  if (s.pre) w.add_string("tokenizer.ggml.pre", *s.pre);
  w.add_string_array("tokenizer.ggml.tokens", s.tokens);
  w.add_i32_array("tokenizer.ggml.token_type", s.types);
  if (!s.scores.empty()) w.add_f32_array("tokenizer.ggml.scores", s.scores);
  if (s.merges) w.add_string_array("tokenizer.ggml.merges", *s.merges);
  if (s.bos >= 0) w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(s.bos));
  if (s.eos >= 0) w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(s.eos));
  if (s.unk >= 0) w.add_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(s.unk));
  if (s.add_bos) w.add_bool("tokenizer.ggml.add_bos_token", *s.add_bos);
  if (s.add_space_prefix) w.add_bool("tokenizer.ggml.add_space_prefix", *s.add_space_prefix);
  if (!s.chat_template.empty()) w.add_string("tokenizer.chat_template", s.chat_template);
  auto file = GgufFile::from_bytes(w.build(), "tiny.gguf");
  if (!file) return file.error();
  return Tokenizer::from_gguf(**file);
}

std::unique_ptr<Tokenizer> must_build(const TinySpec& s) {
  auto t = build(s);
  EXPECT_TRUE(t.ok()) << t.error().message;
  return t.ok() ? std::move(*t) : nullptr;
}

Ids enc(const Tokenizer& t, std::string_view s, bool special = true) {
  auto r = t.encode(s, special);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : Ids{};
}

// ---- GPT-2-style byte-level BPE --------------------------------------------------------

TinySpec gpt2_vocab(std::string pre = "gpt2") {
  TinySpec s;
  s.pre = std::move(pre);
  //          0      1    2    3    4     5     6      7    8 ('Ġ', the mapped space)
  s.tokens = {"<s>", "a", "b", "c", "ab", "bc", "abc", "aa", "\xC4\xA0"};
  s.types = {3, 1, 1, 1, 1, 1, 1, 1, 1};
  s.merges = std::vector<std::string>{"b c", "a b", "a bc", "a a"};
  s.bos = 0;
  return s;
}

TEST(TinyBpe, MergesByRankLeftmostFirst) {
  auto t = must_build(gpt2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "abc"), (Ids{6}));  // b+c (rank 0) first, then a+bc
  EXPECT_EQ(enc(*t, "ab"), (Ids{4}));
  EXPECT_EQ(enc(*t, "aaa"), (Ids{7, 1}));      // tie: leftmost pair merges
  EXPECT_EQ(enc(*t, "<s>abc"), (Ids{0, 6}));   // control token cut out
  EXPECT_EQ(enc(*t, "c ab"), (Ids{3, 8, 4}));  // ' ' + letters: ' ' maps to U+0120
  EXPECT_EQ(enc(*t, "abd"), (Ids{4}));         // 'd' has no token: dropped like llama.cpp
  EXPECT_EQ(t->model_name(), "gpt2");
}

TEST(TinyBpe, LlamaBpeTakesWholeWordsFromTheVocabulary) {
  auto gpt2 = must_build(gpt2_vocab("gpt2"));
  ASSERT_TRUE(gpt2);
  EXPECT_FALSE(gpt2->add_bos());
  auto llama = must_build(gpt2_vocab("llama-bpe"));
  ASSERT_TRUE(llama);
  EXPECT_TRUE(llama->add_bos());
  EXPECT_EQ(enc(*llama, "abc"), (Ids{6}));
  EXPECT_EQ(enc(*llama, "ca"), (Ids{3, 1}));
}

TEST(TinyBpe, BadMetadataIsAnError) {
  TinySpec no_merges = gpt2_vocab();
  no_merges.merges.reset();
  auto a = build(no_merges);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("tokenizer.ggml.merges"), std::string::npos)
      << a.error().message;
  TinySpec bad_bos = gpt2_vocab();
  bad_bos.bos = 9;
  auto b = build(bad_bos);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("bos_token_id"), std::string::npos) << b.error().message;
}

// ---- Unknown tokenizer model / pre-tokenizer --------------------------------------------

TEST(TinyTokenizer, UnknownPreTokenizerIsAnErrorNamingIt) {
  auto t = build(gpt2_vocab("klingon"));
  ASSERT_FALSE(t.ok());
  const std::string& m = t.error().message;
  EXPECT_NE(m.find("pre-tokenizer 'klingon'"), std::string::npos) << m;
  EXPECT_NE(m.find("tokenizer.ggml.pre"), std::string::npos) << m;
  EXPECT_NE(m.find("qwen2"), std::string::npos) << m;  // the supported ones are listed
  EXPECT_NE(m.find("tiny.gguf"), std::string::npos) << m;
}

TEST(TinyTokenizer, UnknownTokenizerModelIsAnErrorNamingIt) {
  for (const char* model : {"bert", "t5", "rwkv", ""}) {
    TinySpec s = gpt2_vocab();
    s.model = model;
    auto t = build(s);
    ASSERT_FALSE(t.ok()) << model;
    const std::string& m = t.error().message;
    EXPECT_NE(m.find("tokenizer model '" + std::string(model) + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("tokenizer.ggml.model"), std::string::npos) << m;
    EXPECT_NE(m.find("'gpt2'"), std::string::npos) << m;
    EXPECT_NE(m.find("'llama'"), std::string::npos) << m;
  }
}

// ---- Qwen2-style byte-level BPE ---------------------------------------------------------

// 'Ġ' (U+0120) is the mapped space, 'Ċ' (U+010A) the mapped newline.
TinySpec qwen2_vocab(std::string pre = "qwen2") {
  TinySpec s;
  s.pre = std::move(pre);
  s.tokens = {"<|endoftext|>",
              "<|im_start|>",
              "<|im_end|>",  // 0 1 2
              "1",
              "2",
              "12",  // 3 4 5
              "a",
              "b",
              "\xC4\xA0",
              "ab",
              "\xC4\xA0"
              "ab",  // 6 7 8 9 10
              "'",
              "S",
              "'S",  // 11 12 13
              "!",
              "!ab",  // 14 15
              "\xC4\x8A",
              "\xC4\x8A\xC4\x8A"};  // 16 17
  s.types = {3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  s.merges =
      std::vector<std::string>{"1 2", "a b", "\xC4\xA0 ab", "' S", "! ab", "\xC4\x8A \xC4\x8A"};
  s.bos = 0;
  s.eos = 2;
  s.chat_template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
      "{% endif %}";
  return s;
}

TEST(TinyQwen2, PreTokenizerSplitsAsTheQwen2Pattern) {
  auto t = must_build(qwen2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->pre_name(), "qwen2");
  EXPECT_FALSE(t->add_bos());
  // \p{N}: every digit is its own piece, so the merge "1 2" never applies.
  EXPECT_EQ(enc(*t, "12"), (Ids{3, 4}));
  // Case-insensitive contractions: "'S" is a piece, then merges to one token.
  EXPECT_EQ(enc(*t, "ab'S"), (Ids{9, 13}));
  // [^\r\n\p{L}\p{N}]?\p{L}+: one non-letter joins the letters after it.
  EXPECT_EQ(enc(*t, "!ab"), (Ids{15}));
  EXPECT_EQ(enc(*t, " ab"), (Ids{10}));
  // A space before a digit stays alone (\s+), then single digits.
  EXPECT_EQ(enc(*t, "ab 12"), (Ids{9, 8, 3, 4}));
  // \s*[\r\n]+: a newline run is one piece.
  EXPECT_EQ(enc(*t, "a\n\nb"), (Ids{6, 17, 7}));
  EXPECT_EQ(enc(*t, "<|im_start|>ab<|im_end|>"), (Ids{1, 9, 2}));
  EXPECT_EQ(t->decode(enc(*t, "ab 12!ab\n\nab'S")), "ab 12!ab\n\nab'S");
}

TEST(TinyQwen2, OtherPatternsSplitTheSameTextDifferently) {
  // The same vocabulary under the GPT-2 pattern: lower-case contractions only, and
  // punctuation is a piece of its own; under Llama 3: numbers of up to three digits.
  auto gpt2 = must_build(qwen2_vocab("gpt2"));
  ASSERT_TRUE(gpt2);
  EXPECT_EQ(enc(*gpt2, "ab'S"), (Ids{9, 11, 12}));
  EXPECT_EQ(enc(*gpt2, "!ab"), (Ids{14, 9}));
  auto llama3 = must_build(qwen2_vocab("llama-bpe"));
  ASSERT_TRUE(llama3);
  EXPECT_EQ(enc(*llama3, "12"), (Ids{5}));
}

TEST(TinyQwen2, ChatMlWithTheTemplatesDefaultSystemAndEndOfGeneration) {
  auto t = must_build(qwen2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->chat_template().format, ChatFormat::ChatMl);
  auto text = t->apply_chat_template({{"user", "ab"}}, true);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n");
  // <|endoftext|> and <|im_end|> end generation; <|im_start|> does not.
  EXPECT_EQ(t->eog_ids(), (Ids{0, 2}));
  EXPECT_TRUE(t->is_eog(0));
  EXPECT_TRUE(t->is_eog(2));
  EXPECT_FALSE(t->is_eog(1));
  EXPECT_FALSE(t->is_eog(9));
}

// ---- Llama-2-style SentencePiece ----------------------------------------------------------

// 0 <unk>, 1 <s>, 2 </s>, 3..258 the byte tokens <0x00>..<0xFF>, then normal pieces with
// scores (higher merges first) and one user-defined token. U+2581 '▁' marks a space.
constexpr int32_t kByte0 = 3;
const std::string kMark = "\xE2\x96\x81";

TinySpec llama2_vocab() {
  TinySpec s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>"};
  s.types = {2, 3, 3};
  s.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    s.tokens.push_back(hex);
    s.types.push_back(6);
    s.scores.push_back(0);
  }
  const std::vector<std::pair<std::string, float>> pieces = {
      {kMark, -10},        // 259
      {"a", -20},          // 260
      {"b", -21},          // 261
      {"c", -22},          // 262
      {"ab", -5},          // 263
      {"bc", -1},          // 264
      {kMark + "a", -8},   // 265
      {kMark + "ab", -3},  // 266
      {"aa", -2},          // 267
      {"\xC3\xA9", -30},   // 268 'é'
  };
  for (const auto& [text, score] : pieces) {
    s.tokens.push_back(text);
    s.types.push_back(1);
    s.scores.push_back(score);
  }
  s.tokens.push_back("<br>");  // 269, user-defined: always split out
  s.types.push_back(4);
  s.scores.push_back(0);
  s.bos = 1;
  s.eos = 2;
  s.unk = 0;
  s.chat_template =
      "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' "
      "+ message['content'] + ' [/INST]' }}{% endif %}{% endfor %}";
  return s;
}

TEST(TinyLlama2, MergesByScoreHighestFirstLeftmostOnTies) {
  auto t = must_build(llama2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->model_name(), "llama");
  EXPECT_TRUE(t->add_bos());  // the SentencePiece default when the key is absent
  EXPECT_EQ(t->bos_id(), 1);
  // "▁abc": bc (-1) beats ab (-5) and ▁a (-8); then ▁a + bc.
  EXPECT_EQ(enc(*t, "abc"), (Ids{265, 264}));
  // "▁ab": ab (-5) before ▁a (-8), then ▁ + ab = ▁ab (-3).
  EXPECT_EQ(enc(*t, "ab"), (Ids{266}));
  // "▁aaa": two aa (-2) pairs tie: the leftmost merges, leaving ▁ aa a.
  EXPECT_EQ(enc(*t, "aaa"), (Ids{259, 267, 260}));
  // Every space becomes ▁ (add_space_prefix puts one in front of the text).
  EXPECT_EQ(enc(*t, "a b"), (Ids{265, 259, 261}));
  EXPECT_EQ(enc(*t, "a  b"), (Ids{265, 259, 259, 261}));
}

TEST(TinyLlama2, CharactersOutsideTheVocabularyBecomeByteTokens) {
  auto t = must_build(llama2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(enc(*t, "\xC3\xA9"), (Ids{259, 268}));                           // é is a piece
  EXPECT_EQ(enc(*t, "\xC3\xBC"), (Ids{259, kByte0 + 0xC3, kByte0 + 0xBC}));  // ü is not
  EXPECT_EQ(enc(*t, "\xF0\x9F\x98\x80"),                                     // 😀
            (Ids{259, kByte0 + 0xF0, kByte0 + 0x9F, kByte0 + 0x98, kByte0 + 0x80}));
  EXPECT_EQ(enc(*t, "a\nb"), (Ids{265, kByte0 + 0x0A, 261}));
  // Never UNK: even a vocabulary entry's bytes come back as byte tokens.
  for (int32_t id : enc(*t, "xyz \x01\x7F")) EXPECT_NE(id, 0);
}

TEST(TinyLlama2, SpecialTokensAndTheSpacePrefix) {
  auto t = must_build(llama2_vocab());
  ASSERT_TRUE(t);
  // Control text is a token only with special parsing; the text after a special token
  // gets the space prefix again.
  EXPECT_EQ(enc(*t, "<s>ab", true), (Ids{1, 266}));
  EXPECT_EQ(enc(*t, "<s>ab", false), (Ids{259, kByte0 + '<', kByte0 + 's', kByte0 + '>', 263}));
  // User-defined tokens are split out even without special parsing.
  EXPECT_EQ(enc(*t, "a<br>b", false), (Ids{265, 269, 259, 261}));
  EXPECT_EQ(enc(*t, "", false), Ids{});

  TinySpec no_prefix = llama2_vocab();
  no_prefix.add_space_prefix = false;
  no_prefix.add_bos = false;
  auto np = must_build(no_prefix);
  ASSERT_TRUE(np);
  EXPECT_FALSE(np->add_bos());
  EXPECT_EQ(enc(*np, "ab"), (Ids{263}));
  EXPECT_EQ(enc(*np, " ab"), (Ids{266}));
  EXPECT_EQ(enc(*np, "a<br>b", false), (Ids{260, 269, 261}));
}

TEST(TinyLlama2, DecodesSpacesBytesAndTheFirstSpace) {
  auto t = must_build(llama2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->token_bytes(265), " a");
  EXPECT_EQ(t->token_bytes(kByte0 + 0xC3), "\xC3");
  EXPECT_EQ(t->token_bytes(1), "<s>");
  EXPECT_EQ(t->token_bytes(269), "<br>");
  EXPECT_EQ(t->token_bytes(-1), "");
  // decode() drops the one space add_space_prefix put in front.
  for (const char* text : {"abc", "a b", "a  b", "\xC3\xBC and \xC3\xA9", "a\nb"})
    EXPECT_EQ(t->decode(enc(*t, text, false)), text);
  // Byte tokens of one character stream out as the whole character, never half.
  Utf8Stream st;
  std::string out;
  for (int32_t id : enc(*t, "\xC3\xBC", false)) {
    const std::string piece = st.push(t->token_bytes(id));
    EXPECT_TRUE(utf8_valid(piece));
    out += piece;
  }
  EXPECT_EQ(out, " \xC3\xBC");
}

TEST(TinyLlama2, ChatIsInstAndEosEndsGeneration) {
  auto t = must_build(llama2_vocab());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->chat_template().format, ChatFormat::Llama2);
  // The system block goes in front of the first user message; the whole is trimmed.
  auto one = t->apply_chat_template({{"system", "Be brief."}, {"user", "ab \n"}}, true);
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(*one, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nab [/INST]");
  auto turns = t->apply_chat_template({{"user", "a"}, {"assistant", "b"}, {"user", "c"}}, true);
  ASSERT_TRUE(turns.ok()) << turns.error().message;
  EXPECT_EQ(*turns, "[INST] a [/INST] b </s><s>[INST] c [/INST]");
  const Ids ids = enc(*t, *turns, true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);  // </s> and <s> parsed as tokens
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
  EXPECT_EQ(t->eog_ids(), (Ids{2}));
}

TEST(TinyLlama2, BadMetadataIsAnError) {
  TinySpec short_scores = llama2_vocab();
  short_scores.scores.pop_back();
  auto a = build(short_scores);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("tokenizer.ggml.scores has 269 entries"), std::string::npos)
      << a.error().message;
  TinySpec no_bos = llama2_vocab();
  no_bos.bos = -1;
  auto b = build(no_bos);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("bos_token_id"), std::string::npos) << b.error().message;
}

// ---- Gemma-style SentencePiece ----------------------------------------------------------

TEST(TinyGemma, TurnsSystemMergedAndEndOfTurnEndsGeneration) {
  TinySpec s = llama2_vocab();
  s.tokens.push_back("<start_of_turn>");  // 270
  s.tokens.push_back("<end_of_turn>");    // 271
  s.types.insert(s.types.end(), {3, 3});
  s.scores.insert(s.scores.end(), {0, 0});
  s.add_space_prefix = false;
  s.chat_template =
      "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' }}"
      "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{% endfor %}";
  auto t = must_build(s);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->chat_template().format, ChatFormat::Gemma);
  auto text = t->apply_chat_template({{"system", "Be brief."}, {"user", " ab "}}, true);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text, "<start_of_turn>user\nBe brief.\n\nab<end_of_turn>\n<start_of_turn>model\n");
  auto reply = t->apply_chat_template({{"user", "a"}, {"assistant", "b"}}, false);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(*reply, "<start_of_turn>user\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n");
  EXPECT_EQ(enc(*t, *text, true).front(), 270);
  EXPECT_EQ(t->eog_ids(), (Ids{2, 271}));
}

TEST(TinyChat, NoTemplateOrAnUnknownOneIsAClearError) {
  TinySpec none = llama2_vocab();
  none.chat_template.clear();
  auto t = must_build(none);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->chat_template().format, ChatFormat::None);
  auto r = t->apply_chat_template({{"user", "hi"}}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no chat template"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("without --chat"), std::string::npos) << r.error().message;

  TinySpec other = llama2_vocab();
  other.chat_template =
      "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}{% endfor %}";
  auto u = must_build(other);
  ASSERT_TRUE(u);
  EXPECT_EQ(u->chat_template().format, ChatFormat::Unrecognized);
  auto e = u->apply_chat_template({{"user", "hi"}}, true);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("ChatML"), std::string::npos) << e.error().message;

  // A ChatML template over a vocabulary without <|im_start|>: named in the error.
  TinySpec chatml = llama2_vocab();
  chatml.chat_template = "{{ '<|im_start|>' + m['role'] }}";
  auto c = must_build(chatml);
  ASSERT_TRUE(c);
  auto ce = c->apply_chat_template({{"user", "hi"}}, true);
  ASSERT_FALSE(ce.ok());
  EXPECT_NE(ce.error().message.find("<|im_start|>"), std::string::npos) << ce.error().message;
}

}  // namespace
}  // namespace kvscope
