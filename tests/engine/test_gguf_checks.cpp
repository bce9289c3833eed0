// test_gguf_checks.cpp — the checks after parsing (engine/gguf_checks.cpp), one corruption
// per test: overlapping tensor data, each well-known metadata key outside its sane range,
// head dimensions the shapes contradict; and file-derived names shown with escapes. The
// built-in models pass every check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "engine/gguf.h"
#include "engine/model.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

using test::GgufLayout;
using test::GgufWriter;
using test::TinyModelSpec;
using ::testing::HasSubstr;

std::string open_error(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_bytes(bytes, "bad.gguf");
  return f.ok() ? "(opened without error)" : f.error().message;
}

// The tiny llama model (C 64, H 4, Hkv 2, D 16, F 96, 2 layers) plus one more key.
template <class Add>
std::string tiny_with(Add add) {
  GgufWriter w = test::tiny_llama(TinyModelSpec{});
  add(w);
  return open_error(w.build());
}

TEST(GgufChecks, TinyModelAndBuiltInModelsPass) {
  EXPECT_EQ(open_error(test::tiny_llama(TinyModelSpec{}).build()), "(opened without error)");
  for (const char* name : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
    const std::string path = std::string(KVSCOPE_SOURCE_DIR) + "/assets/models/" + name;
    if (!std::filesystem::exists(path)) continue;  // the test script fetches both
    auto f = GgufFile::open(path);
    EXPECT_TRUE(f.ok()) << name << ": " << f.error().message;
  }
}

TEST(GgufChecks, OverlappingTensorDataIsRejected) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_tensor_f32("a", {8}, std::vector<float>(8, 1.f));
  w.add_tensor_f32("b", {8}, std::vector<float>(8, 2.f));
  w.add_tensor_f32("c", {8}, std::vector<float>(8, 3.f));
  GgufLayout layout;
  std::vector<uint8_t> bytes = w.build(&layout);
  ASSERT_EQ(open_error(bytes), "(opened without error)");
  // c's data starts 16 bytes into b's: the two share 16 bytes.
  uint64_t b_offset = 0;
  std::memcpy(&b_offset, bytes.data() + layout.tensor_fields[1].offset, 8);
  const uint64_t c_offset = b_offset + 16;
  std::vector<uint8_t> shifted = bytes;
  std::memcpy(shifted.data() + layout.tensor_fields[2].offset, &c_offset, 8);
  // Not a multiple of the alignment (32) either: use alignment 16 via a second file below.
  EXPECT_THAT(open_error(shifted), HasSubstr("alignment"));
  // Same offset as b: full overlap, aligned.
  std::memcpy(shifted.data() + layout.tensor_fields[2].offset, &b_offset, 8);
  EXPECT_THAT(open_error(shifted),
              HasSubstr("tensor 'c' data [" + std::to_string(b_offset) + ", " +
                        std::to_string(b_offset + 32) + ") overlaps tensor 'b'"));
}

TEST(GgufChecks, PartialOverlapIsRejected) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_tensor_f32("big", {32}, std::vector<float>(32, 1.f));  // 128 bytes
  w.add_tensor_f32("small", {8}, std::vector<float>(8, 2.f));
  GgufLayout layout;
  std::vector<uint8_t> bytes = w.build(&layout);
  uint64_t big = 0;
  std::memcpy(&big, bytes.data() + layout.tensor_fields[0].offset, 8);
  const uint64_t inside = big + 96;  // aligned, inside big's 128 bytes
  std::memcpy(bytes.data() + layout.tensor_fields[1].offset, &inside, 8);
  EXPECT_THAT(open_error(bytes), HasSubstr("tensor 'small' data [96, 128) overlaps tensor 'big'"));
}

TEST(GgufChecks, ContextLengthOf2To24IsRejected) {
  TinyModelSpec spec;
  spec.n_ctx = 1 << 24;
  EXPECT_THAT(open_error(test::tiny_llama(spec).build()),
              HasSubstr("'llama.context_length' = 16777216 is outside the sane range 1..16777215"));
  spec.n_ctx = (1 << 24) - 1;
  EXPECT_EQ(open_error(test::tiny_llama(spec).build()), "(opened without error)");
}

TEST(GgufChecks, ContextLengthAbove64BitsSignedIsRejected) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u64("llama.context_length", ~0ull);
  EXPECT_THAT(open_error(w.build()),
              HasSubstr("= 18446744073709551615 is outside the sane range 1..16777215"));
}

TEST(GgufChecks, EachWellKnownIntegerKeyHasARange) {
  struct Case {
    const char* key;
    int64_t bad;
    const char* range;
  };
  const Case cases[] = {
      {"llama.block_count", 0, "1..1024"},
      {"llama.block_count", 5000, "1..1024"},
      {"llama.embedding_length", 1 << 20, "1..65536"},
      {"llama.feed_forward_length", 0, "1..1048576"},
      {"llama.attention.head_count", 0, "1..1024"},
      {"llama.attention.head_count_kv", 4096, "1..1024"},
      {"llama.attention.key_length", 0, "1..4096"},
      {"llama.attention.value_length", 100000, "1..4096"},
      {"llama.rope.dimension_count", -1, "0..4096"},
      {"llama.attention.sliding_window", -5, "0..16777215"},
      {"llama.vocab_size", 0, "1..16777216"},
  };
  for (const Case& c : cases) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_i64(c.key, c.bad);
    EXPECT_THAT(open_error(w.build()),
                HasSubstr(std::string("'") + c.key + "' = " + std::to_string(c.bad) +
                          " is outside the sane range " + c.range))
        << c.key;
  }
}

TEST(GgufChecks, PerLayerArraysAreCheckedElementByElement) {
  GgufWriter ok;
  ok.add_string("general.architecture", "llama");
  ok.add_i32_array("llama.attention.head_count_kv", {4, 0, 4});  // a layer without attention
  EXPECT_EQ(open_error(ok.build()), "(opened without error)");
  GgufWriter bad;
  bad.add_string("general.architecture", "llama");
  bad.add_i32_array("llama.feed_forward_length", {96, -1});
  EXPECT_THAT(
      open_error(bad.build()),
      HasSubstr("'llama.feed_forward_length'[1] = -1 is outside the sane range 0..1048576"));
}

TEST(GgufChecks, FloatKeysMustBeFiniteAndInRange) {
  struct Case {
    const char* key;
    float bad;
    const char* range;
  };
  const Case cases[] = {
      {"llama.attention.layer_norm_rms_epsilon", 0.f, "(0, 1)"},
      {"llama.attention.layer_norm_rms_epsilon", NAN, "(0, 1)"},
      {"llama.attention.layer_norm_epsilon", 2.f, "(0, 1)"},
      {"llama.rope.freq_base", -1.f, "(0, 1e+12]"},
      {"llama.rope.freq_base", INFINITY, "(0, 1e+12]"},
      {"llama.rope.scaling.factor", 0.f, "(0, 1000000]"},
      {"llama.attention.logit_softcapping", NAN, "(0, 1000000]"},
      {"llama.final_logit_softcapping", -30.f, "(0, 1000000]"},
  };
  for (const Case& c : cases) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_f32(c.key, c.bad);
    EXPECT_THAT(open_error(w.build()), HasSubstr(std::string("'") + c.key + "' = ")) << c.key;
    EXPECT_THAT(open_error(w.build()), HasSubstr(std::string("sane range ") + c.range)) << c.key;
  }
}

TEST(GgufChecks, KeysOfAnotherArchitectureOrTypeAreLeftToTheReaders) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("gemma3.context_length", 1u << 30);  // not this file's architecture
  w.add_string("llama.block_count", "many");     // wrong type: the reader names it
  EXPECT_EQ(open_error(w.build()), "(opened without error)");
}

TEST(GgufChecks, KeyLengthTheShapesContradictIsRejected) {
  // D = 64 / 4 = 16 by the shapes; key_length says 32.
  EXPECT_THAT(tiny_with([](GgufWriter& w) { w.add_u32("llama.attention.key_length", 32); }),
              HasSubstr("the head dimension 32 (llama.attention.key_length = 32) is not what the "
                        "shapes say: tensor 'blk.0.attn_q.weight' has 64 rows, expected "
                        "head_count 4 x 32 = 128"));
  EXPECT_EQ(tiny_with([](GgufWriter& w) { w.add_u32("llama.attention.key_length", 16); }),
            "(opened without error)");
}

TEST(GgufChecks, ValueLengthTheShapesContradictIsRejected) {
  EXPECT_THAT(tiny_with([](GgufWriter& w) { w.add_u32("llama.attention.value_length", 8); }),
              HasSubstr("tensor 'blk.0.attn_v.weight' has 32 rows, expected head_count_kv 2 x 8"));
}

TEST(GgufChecks, HeadCountTheShapesContradictIsRejected) {
  // head_count 4 -> 8 makes D = 64 / 8 = 8, but attn_k has 32 rows for 2 KV heads (D 16).
  TinyModelSpec spec;
  GgufWriter w = test::tiny_llama(spec);
  std::vector<uint8_t> bytes = w.build();
  // Rewrite the head_count value in place: find the key and patch the u32 after its type.
  const std::string key = "llama.attention.head_count";
  auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(it, bytes.end());
  const size_t value_at = size_t(it - bytes.begin()) + key.size() + 4;  // after the u32 type
  const uint32_t eight = 8;
  std::memcpy(bytes.data() + value_at, &eight, 4);
  EXPECT_THAT(open_error(bytes),
              HasSubstr("the head dimension 8 (embedding_length / head_count = 64 / 8 = 8) is not "
                        "what the shapes say: tensor 'blk.0.attn_k.weight' has 32 rows, "
                        "expected head_count_kv 2 x 8 = 16"));
}

TEST(GgufChecks, RopeDimensionsAboveTheHeadDimensionAreRejected) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.embedding_length", 64);
  w.add_u32("llama.block_count", 1);
  w.add_u32("llama.attention.head_count", 4);
  w.add_u32("llama.rope.dimension_count", 32);
  EXPECT_THAT(open_error(w.build()),
              HasSubstr("'llama.rope.dimension_count' = 32 is larger than the head dimension 16"));
}

TEST(GgufChecks, NamesFromTheFileAreEscapedInMessages) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  const std::string name("t\0\x1b[2Jx", 7);
  w.add_tensor_f32(name, {4}, {1, 2, 3, 4});
  w.add_tensor_f32(name, {4}, {1, 2, 3, 4});
  const std::string e = open_error(w.build());
  EXPECT_THAT(e, HasSubstr("duplicate tensor name 't\\x00\\x1b[2Jx' (tensor #1)"));
  for (unsigned char c : e) EXPECT_GE(c, 0x20);

  GgufWriter k;
  k.add_u32(std::string("key\x1b]0;title\x07", 13), 1);
  k.add_u32(std::string("key\x1b]0;title\x07", 13), 2);
  EXPECT_THAT(open_error(k.build()), HasSubstr("duplicate metadata key 'key\\x1b]0;title\\x07'"));
}

}  // namespace
}  // namespace kvscope
