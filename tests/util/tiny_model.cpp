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

GgufWriter tiny_model(const TinyModelSpec& s) {
  const uint64_t C = s.n_embd, F = s.n_ff, Hkv = s.n_head_kv;
  const uint64_t D = s.head_dim > 0 ? uint64_t(s.head_dim) : s.n_embd / s.n_head;
  const uint64_t A = uint64_t(s.n_head) * D;  // attention width
  const bool gemma = s.arch == "gemma3", qwen = s.arch == "qwen2";
  const std::string a = s.arch + ".";
  GgufWriter w;
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", "tiny-" + s.arch);
  w.add_u32(a + "block_count", uint32_t(s.n_layer));
  w.add_u32(a + "context_length", uint32_t(s.n_ctx));
  w.add_u32(a + "embedding_length", uint32_t(C));
  w.add_u32(a + "feed_forward_length", uint32_t(F));
  w.add_u32(a + "attention.head_count", uint32_t(s.n_head));
  w.add_u32(a + "attention.head_count_kv", uint32_t(Hkv));
  if (s.head_dim > 0) {
    w.add_u32(a + "attention.key_length", uint32_t(D));
    w.add_u32(a + "attention.value_length", uint32_t(D));
  }
  w.add_u32(a + "rope.dimension_count", uint32_t(D));
  w.add_f32(a + "rope.freq_base", s.rope_base);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (s.window > 0) w.add_u32(a + "attention.sliding_window", uint32_t(s.window));
  if (!s.swa_pattern.empty()) w.add_bool_array(a + "attention.sliding_window_pattern", s.swa_pattern);
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
    if (name == s.skip_tensor) return;
    const bool quantizable = t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 ||
                             t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_1;
    if (!quantizable) {  // other types: zero blocks of the right size
      w.add_tensor(name, {n_in, n_out}, t, std::vector<uint8_t>(row_bytes(t, n_in) * n_out, 0));
      return;
    }
    w.add_tensor(name, {n_in, n_out}, t,
                 quantize_rows(t, random_values(n_in * n_out, 0.5f, state), n_in));
  };
  auto vec = [&](const std::string& name, uint64_t n, float scale, float offset) {
    std::vector<float> g = random_values(n, scale, state);
    for (float& x : g) x += offset;
    if (name != s.skip_tensor) w.add_tensor_f32(name, {n}, g);
  };
  auto norm = [&](const std::string& name) { vec(name, C, 0.5f, 1.0f); };
  mat("token_embd.weight", s.embd_type, C, V);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");
    mat(p + "attn_q.weight", s.matrix_type, C, A);
    mat(p + "attn_k.weight", s.matrix_type, C, Hkv * D);
    mat(p + "attn_v.weight", s.matrix_type, C, Hkv * D);
    if (qwen) {
      vec(p + "attn_q.bias", A, 1.0f, 0.0f);
      vec(p + "attn_k.bias", Hkv * D, 1.0f, 0.0f);
      vec(p + "attn_v.bias", Hkv * D, 1.0f, 0.0f);
    }
    if (gemma) {
      vec(p + "attn_q_norm.weight", D, 0.5f, 1.0f);
      vec(p + "attn_k_norm.weight", D, 0.5f, 1.0f);
    }
    mat(p + "attn_output.weight", s.matrix_type, A, C);
    if (gemma) norm(p + "post_attention_norm.weight");
    norm(p + "ffn_norm.weight");
    mat(p + "ffn_gate.weight", s.matrix_type, C, F);
    mat(p + "ffn_up.weight", s.matrix_type, C, F);
    mat(p + "ffn_down.weight", s.matrix_type, F, C);
    if (gemma) norm(p + "post_ffw_norm.weight");
  }
  norm("output_norm.weight");
  return w;
}

TinyModelSpec tiny_family(const std::string& arch, uint32_t seed) {
  TinyModelSpec s;
  s.arch = arch;
  s.seed = seed;
  if (arch == "gemma3") {
    s.n_layer = 3;
    s.n_head = 4;
    s.n_head_kv = 1;
    s.head_dim = 24;
    s.rope_base = 1e6f;
    s.window = 5;
    s.swa_pattern = {true, true, false};
  }
  return s;
}

GgufWriter tiny_llama(const TinyModelSpec& spec) {
  TinyModelSpec s = spec;
  s.arch = "llama";
  return tiny_model(s);
}

Status write_tiny_model(const TinyModelSpec& spec, const std::string& path) {
  return tiny_model(spec).write(path);
}

Status write_tiny_llama(const TinyModelSpec& spec, const std::string& path) {
  return tiny_llama(spec).write(path);
}

}  // namespace kvscope::test
