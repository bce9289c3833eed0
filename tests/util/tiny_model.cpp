// tiny_model.cpp — see tiny_model.h.
#include "tests/util/tiny_model.h"

#include "engine/quant.h"

namespace kvscope::test {
namespace {

// GPT-2 byte-to-unicode: printable bytes map to themselves, the other 68 to U+0100...
std::string byte_token(int b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      const bool p = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
      if (!p) ++n;
    }
    cp = 0x100 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<float> random_values(size_t n, float scale, uint32_t& state) {
  std::vector<float> v(n);
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = (float(state >> 8) / 16777216.0f - 0.5f) * scale;
  }
  return v;
}

}  // namespace

GgufWriter tiny_llama(const TinyModelSpec& s) {
  const uint64_t C = s.n_embd, F = s.n_ff, D = s.n_embd / s.n_head, Hkv = s.n_head_kv;
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "tiny-llama");
  w.add_u32("llama.block_count", uint32_t(s.n_layer));
  w.add_u32("llama.context_length", uint32_t(s.n_ctx));
  w.add_u32("llama.embedding_length", uint32_t(C));
  w.add_u32("llama.feed_forward_length", uint32_t(F));
  w.add_u32("llama.attention.head_count", uint32_t(s.n_head));
  w.add_u32("llama.attention.head_count_kv", uint32_t(Hkv));
  w.add_u32("llama.rope.dimension_count", uint32_t(D));
  w.add_f32("llama.rope.freq_base", 10000.0f);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "smollm");
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_token(b));
    types.push_back(6);
  }
  const std::vector<std::string> merges = {"Ġ t", "h e", "Ġt he", "i n", "a n"};
  for (const std::string& m : merges) {
    tokens.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
    types.push_back(1);
  }
  const uint64_t V = tokens.size();
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", false);

  uint32_t state = s.seed;
  auto mat = [&](const std::string& name, GgmlType t, uint64_t n_in, uint64_t n_out) {
    const bool quantizable = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 ||
                             t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_1;
    if (!quantizable) {  // other types: zero blocks of the right size
      w.add_tensor(name, {n_in, n_out}, t, std::vector<uint8_t>(row_bytes(t, n_in) * n_out, 0));
      return;
    }
    w.add_tensor(name, {n_in, n_out}, t,
                 quantize_rows(t, random_values(n_in * n_out, 0.5f, state), n_in));
  };
  auto norm = [&](const std::string& name) {
    std::vector<float> g = random_values(C, 0.5f, state);
    for (float& x : g) x += 1.0f;
    w.add_tensor_f32(name, {C}, g);
  };
  mat("token_embd.weight", s.embd_type, C, V);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    mat(p + "attn_q.weight", s.matrix_type, C, s.n_head * D);
    mat(p + "attn_k.weight", s.matrix_type, C, Hkv * D);
    mat(p + "attn_v.weight", s.matrix_type, C, Hkv * D);
    mat(p + "attn_output.weight", s.matrix_type, s.n_head * D, C);
    norm(p + "ffn_norm.weight");
    mat(p + "ffn_gate.weight", s.matrix_type, C, F);
    mat(p + "ffn_up.weight", s.matrix_type, C, F);
    mat(p + "ffn_down.weight", s.matrix_type, F, C);
  }
  norm("output_norm.weight");
  return w;
}

Status write_tiny_llama(const TinyModelSpec& spec, const std::string& path) {
  return tiny_llama(spec).write(path);
}

}  // namespace kvscope::test
