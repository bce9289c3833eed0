// make_fuzz_seeds.cpp — writes the committed fuzz seed corpora (tests/fuzz/corpus/):
//   gguf/       a tiny llama-shaped model (tokenizer arrays, Q8_0 embedding, Q4_1 matrices,
//               F32 norms), a file with every metadata value type, a v2 file with 64-byte
//               alignment, and a file with the other supported block types;
//   model/      small but complete llama models (tests/util/tiny_model) that load and run a
//               step: Q4_0 / Q4_1 / Q8_0 / F16 matrices, one and two layers, GQA and MHA;
//   tokenizer/  texts: ASCII, multi-byte UTF-8, special-token markers, digits, whitespace;
//   scheduler/  scheduler workloads in fuzz_scheduler.cpp's byte layout: a plain batch,
//               pool pressure (preemption), shared prefixes, cancels, invalid requests, a
//               model with attention windows.
// Each file is a few KB so mutation runs stay fast. Regenerate after changing the writers:
//   build/tests/fuzz/make_fuzz_seeds tests/fuzz/corpus
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/quant.h"
#include "tests/util/gguf_writer.h"
#include "tests/util/tiny_model.h"

namespace {

using kvscope::GgmlType;
using kvscope::test::GgufWriter;

std::vector<float> values(size_t n, float scale) {
  std::vector<float> v(n);
  uint32_t s = 12345;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * scale;
  }
  return v;
}

GgufWriter tiny_llama() {
  const int C = 64, F = 96, V = 32, Hkv_D = 32;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "seed");
  w.add_u32("llama.block_count", 1);
  w.add_u32("llama.context_length", 128);
  w.add_u32("llama.embedding_length", C);
  w.add_u32("llama.feed_forward_length", F);
  w.add_u32("llama.attention.head_count", 2);
  w.add_u32("llama.attention.head_count_kv", 1);
  w.add_u32("llama.rope.dimension_count", 32);
  w.add_f32("llama.rope.freq_base", 100000.0f);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "smollm");
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int i = 3; i < V; ++i) {
    tokens.push_back(std::string(1, static_cast<char>('a' + i % 26)) + (i >= 29 ? "b" : ""));
    types.push_back(1);
  }
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", {"a b", "c d"});
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  auto q = [&](GgmlType t, uint64_t n_in, uint64_t n_out) {
    return kvscope::test::quantize_rows(t, values(n_in * n_out, 1.0f), n_in);
  };
  w.add_tensor("token_embd.weight", {C, V}, GgmlType::Q8_0, q(GgmlType::Q8_0, C, V));
  w.add_tensor_f32("blk.0.attn_norm.weight", {C}, values(C, 2.0f));
  w.add_tensor("blk.0.attn_q.weight", {C, C}, GgmlType::Q4_1, q(GgmlType::Q4_1, C, C));
  w.add_tensor("blk.0.attn_k.weight", {C, Hkv_D}, GgmlType::Q4_1, q(GgmlType::Q4_1, C, Hkv_D));
  w.add_tensor("blk.0.attn_v.weight", {C, Hkv_D}, GgmlType::Q4_1, q(GgmlType::Q4_1, C, Hkv_D));
  w.add_tensor("blk.0.attn_output.weight", {C, C}, GgmlType::Q4_1, q(GgmlType::Q4_1, C, C));
  w.add_tensor_f32("blk.0.ffn_norm.weight", {C}, values(C, 2.0f));
  w.add_tensor("blk.0.ffn_gate.weight", {C, F}, GgmlType::Q4_1, q(GgmlType::Q4_1, C, F));
  w.add_tensor("blk.0.ffn_up.weight", {C, F}, GgmlType::Q4_1, q(GgmlType::Q4_1, C, F));
  w.add_tensor("blk.0.ffn_down.weight", {F, C}, GgmlType::Q4_1, q(GgmlType::Q4_1, F, C));
  w.add_tensor_f32("output_norm.weight", {C}, values(C, 2.0f));
  return w;
}

GgufWriter all_metadata_types() {
  GgufWriter w;
  w.add_u8("u8", 1);
  w.add_i8("i8", -1);
  w.add_u16("u16", 2);
  w.add_i16("i16", -2);
  w.add_u32("u32", 3);
  w.add_i32("i32", -3);
  w.add_u64("u64", 4);
  w.add_i64("i64", -4);
  w.add_f32("f32", 0.5f);
  w.add_f64("f64", 0.25);
  w.add_bool("bool", true);
  w.add_string("string", "text");
  w.add_string_array("strings", {"x", "yy", ""});
  w.add_i32_array("i32s", {1, 2});
  w.add_u8_array("u8s", {1, 2, 3});
  w.add_f32_array("f32s", {1.0f});
  w.add_f64_array("f64s", {2.0});
  w.add_bool_array("bools", {true});
  w.add_i64_array("i64s", {-7});
  w.add_tensor_f32("t", {4, 2}, values(8, 1.0f));
  return w;
}

GgufWriter v2_aligned() {
  GgufWriter w;
  w.set_version(2);
  w.set_alignment(64);
  w.add_string("general.architecture", "llama");
  w.add_tensor("a", {32, 2}, GgmlType::Q4_0,
               kvscope::test::quantize_rows(GgmlType::Q4_0, values(64, 1.0f), 32));
  w.add_tensor("b", {16, 1, 1, 2}, GgmlType::F16,
               kvscope::test::quantize_rows(GgmlType::F16, values(32, 1.0f), 16));
  return w;
}

GgufWriter other_blocks() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  auto raw = [](GgmlType t, uint64_t n) {
    std::vector<uint8_t> b(kvscope::row_bytes(t, n));
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 29 + 7);
    return b;
  };
  w.add_tensor("q5_0", {32}, GgmlType::Q5_0, raw(GgmlType::Q5_0, 32));
  w.add_tensor("q5_1", {32}, GgmlType::Q5_1, raw(GgmlType::Q5_1, 32));
  w.add_tensor("q4_k", {256}, GgmlType::Q4_K, raw(GgmlType::Q4_K, 256));
  w.add_tensor("q6_k", {256}, GgmlType::Q6_K, raw(GgmlType::Q6_K, 256));
  w.add_tensor("bf16", {8}, GgmlType::BF16, raw(GgmlType::BF16, 8));
  w.add_tensor("q2_k", {256}, GgmlType::Q2_K, raw(GgmlType::Q2_K, 256));
  return w;
}

// Small complete models: every variant loads and runs a forward step.
std::vector<std::pair<std::string, GgufWriter>> model_seeds() {
  using kvscope::test::TinyModelSpec;
  std::vector<std::pair<std::string, GgufWriter>> out;
  auto add = [&](const char* name, TinyModelSpec s) {
    out.push_back({name, kvscope::test::tiny_llama(s)});
  };
  TinyModelSpec base;
  base.n_layer = 1;
  base.n_embd = 32;
  base.n_head = 2;
  base.n_head_kv = 1;
  base.n_ff = 32;
  base.n_ctx = 64;
  base.matrix_type = GgmlType::Q4_0;
  base.embd_type = GgmlType::Q8_0;
  add("llama_q4_0_gqa.gguf", base);
  TinyModelSpec q41 = base;
  q41.matrix_type = GgmlType::Q4_1;
  q41.n_head_kv = 2;
  add("llama_q4_1_mha.gguf", q41);
  TinyModelSpec two = base;
  two.n_layer = 2;
  two.matrix_type = GgmlType::Q8_0;
  add("llama_q8_0_two_layers.gguf", two);
  TinyModelSpec f16 = base;
  f16.matrix_type = GgmlType::F16;
  f16.embd_type = GgmlType::F16;
  f16.n_ctx = 8;
  add("llama_f16_short_context.gguf", f16);
  return out;
}

const std::pair<const char*, const char*> kTexts[] = {
    {"ascii.txt", "The quick brown fox jumps over the lazy dog. 12345 + 678 = 13023!"},
    {"utf8.txt",
     "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 \xd0\x9f\xd1\x80\xd0\xb8"},
    {"special.txt", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<|endoftext|>"},
    {"whitespace.txt", "  a\t\tb\n\n\n   c \r\n"},
    {"code.txt", "def f(x):\n    return x ** 2  # 'squared'\n"},
    {"digits.txt", "3.14159265358979 1,000,000 \xd9\xa3\xd9\xa4 \xe2\x85\xa7"},
};

// One fuzz_scheduler request: length, share, arrival, max tokens, sampling, then ids.
void sched_request(std::vector<uint8_t>& b, int len, int share, int arrival, int max_tokens,
                   int sampling, int first_id) {
  for (int v : {len, share, arrival, max_tokens, sampling}) b.push_back(static_cast<uint8_t>(v));
  const int own = (share & 0x80) ? len - std::min(len, share & 0x7f) : len;
  for (int i = 0; i < own; ++i) b.push_back(static_cast<uint8_t>((first_id + i * 37) % 250));
}

// Workloads for fuzz_scheduler (see the byte layout at the top of fuzz_scheduler.cpp).
std::vector<std::pair<std::string, std::vector<uint8_t>>> scheduler_seeds() {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  // Block 16, 16 blocks, budget 32, 4 sequences, prefix caching + EOS: three requests,
  // one chunked, one sampled.
  std::vector<uint8_t> b = {1, 15, 31, 3, 0x3, 0, 3};
  sched_request(b, 10, 0, 0, 8, 0, 5);
  sched_request(b, 40, 0, 2, 6, 0, 60);
  sched_request(b, 5, 0, 4, 10, 1 | (7 << 1), 120);
  out.push_back({"basic.bin", b});
  // Block 8, 5 blocks for four requests that each grow to 4: preemption.
  b = {0, 4, 63, 7, 0x0, 0, 4};
  for (int i = 0; i < 4; ++i) sched_request(b, 12, 0, 0, 20, 0, 10 + 20 * i);
  out.push_back({"preempt.bin", b});
  // Block 8, 32 blocks, budget 16: later prompts start with the earlier ones' blocks.
  b = {0, 31, 15, 5, 0x1, 0, 4};
  sched_request(b, 30, 0, 0, 4, 0, 3);
  sched_request(b, 34, 0x80 | 24, 6, 4, 0, 90);
  sched_request(b, 26, 0x80 | 26, 12, 4, 0, 140);
  sched_request(b, 40, 0x80 | 16, 2, 5, 0, 200);
  out.push_back({"prefix_cache.bin", b});
  // Five requests, three cancels (pending, running, unknown id).
  b = {2, 20, 40, 2, 0x3, 0, 5};
  for (int i = 0; i < 5; ++i) sched_request(b, 8 + 6 * i, 0, 1 + 3 * i, 12, 0, 30 * i);
  for (int v : {4, 2, 1, 4, 5, 6}) b.push_back(static_cast<uint8_t>(v));
  out.push_back({"cancel.bin", b});
  // A 24-position context: an empty prompt, an id outside the vocabulary, a prompt as long
  // as the context, no tokens to generate, more blocks than the pool; then a valid one.
  b = {0, 1, 8, 1, 0x4, 22, 6};
  sched_request(b, 0, 0, 0, 4, 0, 0);
  b.insert(b.end(), {3, 0, 0, 4, 0, 7, 255, 9});
  sched_request(b, 24, 0, 0, 4, 0, 11);
  sched_request(b, 4, 0, 0, 0, 0, 12);
  sched_request(b, 10, 0, 0, 10, 0, 13);
  sched_request(b, 6, 0, 0, 10, 0, 14);
  out.push_back({"invalid.bin", b});
  // The windowed gemma3, block 8, budget 12: long prompts in chunks, the local groups giving
  // blocks back, a later prompt with the same start, a tight pool.
  b = {0, 17, 11, 3, 0x9, 0, 4};
  sched_request(b, 40, 0, 0, 16, 0, 21);
  sched_request(b, 44, 0x80 | 32, 8, 8, 0, 77);
  sched_request(b, 9, 0, 2, 20, 0, 130);
  sched_request(b, 30, 0x80 | 24, 30, 6, 1 | (3 << 1), 170);
  out.push_back({"windowed.bin", b});
  return out;
}

bool write_seeds(const std::filesystem::path& dir,
                 const std::vector<std::pair<std::string, GgufWriter>>& seeds) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return false;
  }
  for (const auto& [name, w] : seeds) {
    const kvscope::Status s = w.write((dir / name).string());
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return false;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (e.g. tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  std::vector<std::pair<std::string, GgufWriter>> gguf;
  gguf.push_back({"tiny_llama.gguf", tiny_llama()});
  gguf.push_back({"all_metadata_types.gguf", all_metadata_types()});
  gguf.push_back({"v2_aligned.gguf", v2_aligned()});
  gguf.push_back({"other_blocks.gguf", other_blocks()});
  if (!write_seeds(root / "gguf", gguf) || !write_seeds(root / "model", model_seeds())) return 1;
  std::filesystem::create_directories(root / "tokenizer");
  for (const auto& [name, text] : kTexts) {
    std::ofstream f(root / "tokenizer" / name, std::ios::binary);
    f << text;
    if (!f) return 1;
  }
  std::printf("wrote %zu texts to %s\n", sizeof(kTexts) / sizeof(kTexts[0]),
              (root / "tokenizer").c_str());
  std::filesystem::create_directories(root / "scheduler");
  const auto sched = scheduler_seeds();
  for (const auto& [name, bytes] : sched) {
    std::ofstream f(root / "scheduler" / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    if (!f) return 1;
  }
  std::printf("wrote %zu workloads to %s\n", sched.size(), (root / "scheduler").c_str());
  return 0;
}
