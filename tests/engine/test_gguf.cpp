// test_gguf.cpp — GGUF reader: round trip through the test writer, the real default
// model, and corrupted files (one corruption per test, each with a message naming it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/util/gguf_writer.h"

namespace kvscope {
namespace {

using test::GgufLayout;
using test::GgufWriter;
using ::testing::HasSubstr;

template <class T>
void patch(std::vector<uint8_t>& b, uint64_t at, T v) {
  ASSERT_LE(at + sizeof(T), b.size());
  std::memcpy(b.data() + at, &v, sizeof(T));
}

std::vector<float> ramp(size_t n, float scale = 0.01f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i % 97) - 48.0f) * scale;
  return v;
}

// A small valid file: a few keys, an F32 norm and a Q4_1 matrix.
GgufWriter tiny_writer() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("llama.block_count", 1);
  w.add_tensor_f32("output_norm.weight", {64}, ramp(64));
  w.add_tensor("blk.0.attn_q.weight", {64, 4}, GgmlType::Q4_1,
               test::quantize_rows(GgmlType::Q4_1, ramp(256), 64));
  return w;
}

std::string open_error(std::vector<uint8_t> bytes) {
  auto f = GgufFile::from_bytes(std::move(bytes), "bad.gguf");
  if (f.ok()) return "(opened without error)";
  return f.error().message;
}

TEST(GgufRoundTrip, MetadataOfEveryType) {
  GgufWriter w;
  w.add_u8("k.u8", 200);
  w.add_i8("k.i8", -100);
  w.add_u16("k.u16", 60000);
  w.add_i16("k.i16", -30000);
  w.add_u32("k.u32", 4000000000u);
  w.add_i32("k.i32", -2000000000);
  w.add_u64("k.u64", 1ull << 60);
  w.add_i64("k.i64", -(1ll << 60));
  w.add_f32("k.f32", 1.5f);
  w.add_f64("k.f64", -2.25);
  w.add_bool("k.bool", true);
  w.add_string("k.str", "héllo wörld");
  w.add_string_array("k.strs", {"a", "", "<|im_start|>"});
  w.add_i32_array("k.i32s", {1, -2, 3});
  w.add_u32_array("k.u32s", {4000000000u});
  w.add_i64_array("k.i64s", {-5});
  w.add_u8_array("k.u8s", {255, 0});
  w.add_f32_array("k.f32s", {0.5f, -1.0f});
  w.add_f64_array("k.f64s", {1e300});
  w.add_bool_array("k.bools", {true, false});
  auto f = GgufFile::from_bytes(w.build(), "rt.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 20u);
  EXPECT_EQ(g.metadata()[0].first, "k.u8");
  EXPECT_EQ(g.get_int("k.u8").value(), 200);
  EXPECT_EQ(g.get_int("k.i8").value(), -100);
  EXPECT_EQ(g.get_int("k.u16").value(), 60000);
  EXPECT_EQ(g.get_int("k.i16").value(), -30000);
  EXPECT_EQ(g.get_int("k.u32").value(), 4000000000ll);
  EXPECT_EQ(g.get_int("k.i32").value(), -2000000000);
  EXPECT_EQ(g.get_int("k.u64").value(), 1ll << 60);
  EXPECT_EQ(g.get_int("k.i64").value(), -(1ll << 60));
  EXPECT_EQ(g.get_float("k.f32").value(), 1.5);
  EXPECT_EQ(g.get_float("k.f64").value(), -2.25);
  EXPECT_EQ(g.get_float("k.u32").value(), 4e9);  // integers are accepted as floats
  EXPECT_TRUE(g.get_bool("k.bool").value());
  EXPECT_EQ(g.get_string("k.str").value(), "héllo wörld");
  EXPECT_EQ(g.get_string_array("k.strs").value(),
            (std::vector<std::string>{"a", "", "<|im_start|>"}));
  EXPECT_EQ(g.get_int_array("k.i32s").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(g.get_int_array("k.u32s").value(), (std::vector<int64_t>{4000000000ll}));
  EXPECT_EQ(g.get_int_array("k.i64s").value(), (std::vector<int64_t>{-5}));
  EXPECT_EQ(g.get_int_array("k.u8s").value(), (std::vector<int64_t>{255, 0}));
  EXPECT_EQ(g.get_float_array("k.f32s").value(), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(g.get_float_array("k.f64s").value(), (std::vector<double>{1e300}));
  EXPECT_EQ(g.get_int_array("k.bools").value(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(g.find("k.strs")->array_len, 3u);
  EXPECT_EQ(g.find("k.strs")->elem_type, GgufType::STRING);
}

TEST(GgufRoundTrip, GetterErrorsNameKeyAndType) {
  GgufWriter w;
  w.add_string("general.name", "x");
  w.add_u64("big", std::numeric_limits<uint64_t>::max());
  auto f = GgufFile::from_bytes(w.build(), "getters.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto missing = (*f)->get_int("llama.block_count");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr("'llama.block_count' is missing"));
  EXPECT_THAT(missing.error().message, HasSubstr("getters.gguf"));
  auto wrong = (*f)->get_int("general.name");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.error().message, HasSubstr("has type string, expected an integer"));
  auto range = (*f)->get_int("big");
  ASSERT_FALSE(range.ok());
  EXPECT_THAT(range.error().message, HasSubstr("out of range"));
  EXPECT_FALSE((*f)->get_string_array("general.name").ok());
  EXPECT_FALSE((*f)->get_bool("general.name").ok());
}

TEST(GgufRoundTrip, TensorsAndCustomAlignment) {
  GgufWriter w = tiny_writer();
  w.set_alignment(64);
  w.add_tensor("token_embd.weight", {32, 3}, GgmlType::Q8_0,
               test::quantize_rows(GgmlType::Q8_0, ramp(96), 32));
  GgufLayout lay;
  const auto bytes = w.build(&lay);
  auto f = GgufFile::from_bytes(bytes, "aligned.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufFile& g = **f;
  EXPECT_EQ(g.alignment(), 64u);
  ASSERT_EQ(g.tensors().size(), 3u);
  EXPECT_EQ(lay.data_start % 64, 0u);
  for (const TensorInfo& t : g.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  const TensorInfo* q = g.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::Q4_1);
  EXPECT_EQ(q->ne, (std::vector<uint64_t>{64, 4}));
  EXPECT_EQ(q->n_elements(), 256u);
  EXPECT_EQ(q->nbytes, 4u * 40u);
  const TensorInfo* norm = g.find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  std::vector<float> back(64);
  dequantize_row(norm->type, norm->data, back.data(), 64);
  EXPECT_EQ(back, ramp(64));
  const TensorInfo* e = g.find_tensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(0, std::memcmp(e->data, bytes.data() + lay.tensor_data[2], e->nbytes));
  EXPECT_EQ(g.find_tensor("nope"), nullptr);
}

TEST(GgufRoundTrip, Version2IsAccepted) {
  GgufWriter w = tiny_writer();
  w.set_version(2);
  auto f = GgufFile::from_bytes(w.build(), "v2.gguf");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->version(), 2u);
}

TEST(GgufOpen, MapsAFileFromDisk) {
  const std::string path =
      ::testing::TempDir() + "/kvscope_test_gguf_open." + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(tiny_writer().write(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
  ASSERT_NE((*f)->find_tensor("output_norm.weight"), nullptr);
  EXPECT_EQ(reinterpret_cast<const float*>((*f)->find_tensor("output_norm.weight")->data)[1],
            ramp(64)[1]);
  std::filesystem::remove(path);
}

TEST(GgufOpen, MissingFileNamesThePath) {
  auto f = GgufFile::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.error().message, HasSubstr("/nonexistent/dir/model.gguf"));
  EXPECT_THAT(f.error().message, HasSubstr("cannot open"));
}

TEST(GgufDefaultModel, HasTheExpectedArchitectureAndTypes) {
  const std::string path = KVSCOPE_DEFAULT_MODEL;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "default model not present at " << path;
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufFile& g = **f;
  EXPECT_EQ(g.file_size(), 98362432u);
  EXPECT_EQ(g.get_string("general.architecture").value(), "llama");
  const int64_t blocks = g.get_int("llama.block_count").value();
  EXPECT_EQ(blocks, 30);
  EXPECT_EQ(g.get_int("llama.embedding_length").value(), 576);
  EXPECT_EQ(g.get_int("llama.feed_forward_length").value(), 1536);
  EXPECT_EQ(g.get_int("llama.attention.head_count").value(), 9);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv").value(), 3);
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  // 9 tensors per block + token_embd + output_norm (tied output: no output.weight).
  EXPECT_EQ(g.tensors().size(), static_cast<size_t>(9 * blocks + 2));
  EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
  const TensorInfo* embd = g.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::Q8_0);
  EXPECT_EQ(embd->ne, (std::vector<uint64_t>{576, 49152}));
  uint64_t params = 0;
  int matrices = 0;
  for (const TensorInfo& t : g.tensors()) {
    params += t.n_elements();
    if (t.name.find("norm") != std::string::npos) {
      EXPECT_EQ(t.type, GgmlType::F32) << t.name;
      EXPECT_EQ(t.ne.size(), 1u) << t.name;
    } else if (t.name.rfind("blk.", 0) == 0) {
      EXPECT_EQ(t.type, GgmlType::Q4_1) << t.name;
      ++matrices;
    }
    EXPECT_TRUE(type_supported(t.type)) << t.name;
  }
  EXPECT_EQ(matrices, 210);
  EXPECT_EQ(params, 134515008u);
  const TensorInfo* q = g.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne, (std::vector<uint64_t>{576, 576}));
  const TensorInfo* k = g.find_tensor("blk.29.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne, (std::vector<uint64_t>{576, 192}));
  // Real weights decode to finite, non-trivial values; vec_dot agrees with dequantize.
  for (const TensorInfo* t : {embd, q, g.find_tensor("output_norm.weight")}) {
    ASSERT_NE(t, nullptr);
    const int64_t n = static_cast<int64_t>(t->ne[0]);
    std::vector<float> w(n);
    dequantize_row(t->type, t->data, w.data(), n);
    double sumsq = 0, dot = 0;
    for (float v : w) {
      ASSERT_TRUE(std::isfinite(v)) << t->name;
      sumsq += static_cast<double>(v) * v;
      dot += static_cast<double>(v) * 0.5;
    }
    EXPECT_GT(sumsq, 1e-6) << t->name;
    const std::vector<float> x(n, 0.5f);
    EXPECT_NEAR(vec_dot(t->type, t->data, x.data(), n), dot, 1e-4 * std::sqrt(sumsq * n) + 1e-5)
        << t->name;
  }
}

// ---- corrupted files: one corruption each ----

TEST(GgufCorrupt, EmptyInput) {
  EXPECT_THAT(open_error({}), HasSubstr("truncated"));
}

TEST(GgufCorrupt, BadMagic) {
  auto b = tiny_writer().build();
  b[0] = 'G';
  b[1] = 'G';
  b[2] = 'M';
  b[3] = 'L';
  const std::string e = open_error(b);
  EXPECT_THAT(e, HasSubstr("bad magic 'GGML'"));
  EXPECT_THAT(e, HasSubstr("bad.gguf"));
}

TEST(GgufCorrupt, UnknownVersion) {
  auto b = tiny_writer().build();
  patch<uint32_t>(b, 4, 4);
  EXPECT_THAT(open_error(b), HasSubstr("unsupported GGUF version 4 (supported: 2, 3)"));
}

TEST(GgufCorrupt, Version1IsRejected) {
  auto b = tiny_writer().build();
  patch<uint32_t>(b, 4, 1);
  EXPECT_THAT(open_error(b), HasSubstr("unsupported GGUF version 1"));
}

TEST(GgufCorrupt, TruncatedHeader) {
  auto b = tiny_writer().build();
  b.resize(12);  // cut inside tensor_count
  EXPECT_THAT(open_error(b),
              HasSubstr("truncated file: header tensor_count needs 8 bytes at offset 8"));
}

TEST(GgufCorrupt, TruncatedMetadata) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "SmolLM2");
  w.add_u32("llama.block_count", 30);
  GgufLayout lay;
  auto b = w.build(&lay);
  b.resize(lay.kv_offsets[1] + 10);  // 2 of the 12 bytes of the second key's name
  EXPECT_THAT(open_error(b),
              HasSubstr("metadata key #1 length 12 at offset " + std::to_string(lay.kv_offsets[1]) +
                        " exceeds the 2 bytes left in the file"));
}

TEST(GgufCorrupt, TruncatedMetadataValue) {
  GgufWriter w;
  w.add_string("general.name", "a long enough name to cut");
  for (int i = 0; i < 8; ++i) w.add_u8("pad." + std::to_string(i), 1);
  GgufLayout lay;
  auto b = w.build(&lay);
  // Cut the file in the middle of general.name's string value.
  b.resize(lay.kv_offsets[0] + 8 + 12 + 4 + 8 + 5);
  // Fix the kv count so the count pre-check passes and the value read is what fails.
  patch<uint64_t>(b, 16, 1);
  EXPECT_THAT(open_error(b),
              HasSubstr("metadata key 'general.name' string value length 25 at offset"));
}

TEST(GgufCorrupt, TruncatedTensorData) {
  auto b = tiny_writer().build();
  b.resize(b.size() - 10);
  const std::string e = open_error(b);
  EXPECT_THAT(e, HasSubstr("tensor 'blk.0.attn_q.weight': offset"));
  EXPECT_THAT(e, HasSubstr("160 bytes is past the end of the file (" + std::to_string(b.size()) +
                           " bytes"));
}

TEST(GgufCorrupt, HugeTensorCount) {
  auto b = tiny_writer().build();
  patch<uint64_t>(b, 8, uint64_t{1} << 62);
  EXPECT_THAT(open_error(b), HasSubstr("tensor_count 4611686018427387904 cannot fit"));
}

TEST(GgufCorrupt, HugeMetadataCount) {
  auto b = tiny_writer().build();
  patch<uint64_t>(b, 16, ~uint64_t{0});
  EXPECT_THAT(open_error(b), HasSubstr("metadata_kv_count 18446744073709551615 cannot fit"));
}

TEST(GgufCorrupt, HugeStringLength) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.kv_offsets[0], uint64_t{1} << 63);
  EXPECT_THAT(open_error(b), HasSubstr("metadata key #0 length 9223372036854775808"));
}

TEST(GgufCorrupt, HugeArrayCount) {
  GgufWriter w;
  w.add_i32_array("tokenizer.ggml.token_type", {1, 2, 3});
  GgufLayout lay;
  auto b = w.build(&lay);
  // key length(8) + key + value type(4) + element type(4) -> element count
  const uint64_t at = lay.kv_offsets[0] + 8 + 25 + 4 + 4;
  patch<uint64_t>(b, at, uint64_t{1} << 61);
  EXPECT_THAT(open_error(b), HasSubstr("'tokenizer.ggml.token_type': array of 2305843009213693952 "
                                       "i32 elements"));
}

TEST(GgufCorrupt, HugeTensorNameLength) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.tensor_fields[1].info, uint64_t{1} << 40);
  EXPECT_THAT(open_error(b), HasSubstr("tensor info #1 name length 1099511627776"));
}

TEST(GgufCorrupt, NestedArrayIsRejected) {
  GgufWriter w;
  // Element type ARRAY (9, little-endian u32), then a zero count and some padding.
  std::vector<uint8_t> enc(20, 0);
  enc[0] = static_cast<uint8_t>(GgufType::ARRAY);
  w.add_raw("nested", GgufType::ARRAY, enc);
  EXPECT_THAT(open_error(w.build()), HasSubstr("'nested'"));
  EXPECT_THAT(open_error(w.build()), HasSubstr("nested arrays are not supported"));
}

TEST(GgufCorrupt, UnknownValueType) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  // First key is "general.architecture" (20 bytes).
  patch<uint32_t>(b, lay.kv_offsets[0] + 8 + 20, 13);
  EXPECT_THAT(
      open_error(b),
      HasSubstr("'general.architecture' at offset 52: unknown value type 13 (allowed 0..12)"));
}

TEST(GgufCorrupt, BoolOutOfRange) {
  GgufWriter w;
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  auto b = w.build();
  b.back() = 7;
  EXPECT_THAT(open_error(b), HasSubstr("bool with byte value 7 (allowed: 0 or 1)"));
}

TEST(GgufCorrupt, DuplicateKey) {
  GgufWriter w = tiny_writer();
  w.add_u32("llama.block_count", 2);
  EXPECT_THAT(open_error(w.build()), HasSubstr("duplicate metadata key 'llama.block_count'"));
}

TEST(GgufCorrupt, DuplicateTensorName) {
  GgufWriter w = tiny_writer();
  w.add_tensor_f32("output_norm.weight", {64}, ramp(64));
  EXPECT_THAT(open_error(w.build()), HasSubstr("duplicate tensor name 'output_norm.weight'"));
}

TEST(GgufCorrupt, OffsetPastTheEnd) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.tensor_fields[0].offset, 1ull << 20);
  EXPECT_THAT(open_error(b), HasSubstr("tensor 'output_norm.weight': offset 1048576 + 256 bytes is "
                                       "past the end of the file (" +
                                       std::to_string(b.size()) + " bytes"));
}

TEST(GgufCorrupt, OffsetNearUint64MaxDoesNotWrap) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.tensor_fields[0].offset, ~uint64_t{0} - 31);  // aligned to 32
  EXPECT_THAT(open_error(b), HasSubstr("is past the end of the file"));
}

TEST(GgufCorrupt, MisalignedOffset) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.tensor_fields[1].offset, 260);
  EXPECT_THAT(open_error(b), HasSubstr("tensor 'blk.0.attn_q.weight': offset 260 is not a multiple "
                                       "of the alignment 32"));
}

TEST(GgufCorrupt, AlignmentZero) {
  GgufWriter w = tiny_writer();
  w.add_u32("general.alignment", 0);
  EXPECT_THAT(open_error(w.build()), HasSubstr("general.alignment = 0 is not a power of two"));
}

TEST(GgufCorrupt, AlignmentNotPowerOfTwo) {
  GgufWriter w = tiny_writer();
  w.add_u32("general.alignment", 48);
  EXPECT_THAT(open_error(w.build()), HasSubstr("general.alignment = 48 is not a power of two"));
}

TEST(GgufCorrupt, AlignmentWrongType) {
  GgufWriter w = tiny_writer();
  w.add_string("general.alignment", "32");
  EXPECT_THAT(open_error(w.build()), HasSubstr("general.alignment has type string"));
}

TEST(GgufCorrupt, UnknownTensorType) {
  GgufWriter w = tiny_writer();
  w.add_tensor_raw("mystery.weight", {32}, 99, std::vector<uint8_t>(64));
  EXPECT_THAT(open_error(w.build()), HasSubstr("tensor 'mystery.weight': unknown ggml type id 99"));
}

TEST(GgufCorrupt, RemovedTensorTypeIsUnknown) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint32_t>(b, lay.tensor_fields[1].type, 4);  // Q4_2, removed from ggml
  EXPECT_THAT(open_error(b), HasSubstr("tensor 'blk.0.attn_q.weight': unknown ggml type id 4"));
}

TEST(GgufCorrupt, ZeroDimension) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.tensor_fields[1].ne0 + 8, 0);  // ne[1] = 0
  EXPECT_THAT(open_error(b),
              HasSubstr("tensor 'blk.0.attn_q.weight': dimension ne[1] is 0 in shape [64, 0]"));
}

TEST(GgufCorrupt, TooManyDimensions) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint32_t>(b, lay.tensor_fields[0].n_dims, 5);
  EXPECT_THAT(open_error(b),
              HasSubstr("tensor 'output_norm.weight': n_dims 5 is out of range 1..4"));
}

TEST(GgufCorrupt, ZeroDimensions) {
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint32_t>(b, lay.tensor_fields[0].n_dims, 0);
  EXPECT_THAT(open_error(b), HasSubstr("n_dims 0 is out of range 1..4"));
}

TEST(GgufCorrupt, OverflowingDimensions) {
  GgufWriter w;
  w.add_tensor("huge", {1ull << 32, 1ull << 32, 4}, GgmlType::F32, std::vector<uint8_t>(64));
  EXPECT_THAT(open_error(w.build()), HasSubstr("tensor 'huge': element count of shape "
                                               "[4294967296, 4294967296, 4] overflows"));
}

TEST(GgufCorrupt, ByteSizeOverflow) {
  GgufWriter w;
  // 2^62 F32 values fit in 63 bits as a count but need 2^64 bytes.
  w.add_tensor("wide", {1ull << 31, 1ull << 31}, GgmlType::F32, std::vector<uint8_t>(64));
  EXPECT_THAT(open_error(w.build()), HasSubstr("tensor 'wide': byte size of shape"));
}

TEST(GgufCorrupt, RowNotABlockMultiple) {
  GgufWriter w;
  w.add_tensor("blk.0.ffn_up.weight", {48, 2}, GgmlType::Q4_1, std::vector<uint8_t>(60));
  EXPECT_THAT(open_error(w.build()),
              HasSubstr("tensor 'blk.0.ffn_up.weight': row length ne[0] = 48 "
                        "is not a multiple of the Q4_1 block size 32"));
}

TEST(GgufCorrupt, ShapeLargerThanItsData) {
  // The shape says 64x400 F32 (102400 bytes) but only 256 bytes follow.
  GgufLayout lay;
  auto b = tiny_writer().build(&lay);
  patch<uint64_t>(b, lay.tensor_fields[1].ne0 + 8, 400);  // attn_q: 64 x 400 Q4_1
  EXPECT_THAT(open_error(b), HasSubstr("tensor 'blk.0.attn_q.weight': offset 256 + 16000 bytes is "
                                       "past the end of the file"));
}

}  // namespace
}  // namespace kvscope
