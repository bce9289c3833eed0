// model.h — a transformer model read from a GGUF file, described so that one forward
// pass (engine/forward.cpp) runs every supported family.
//
// ModelConfig says what the model does: widths, and per layer what each block does
// (attention window, RoPE base), plus the family-wide choices (RoPE pairing, FFN gate
// activation, embedding and attention scales, which optional norms and biases exist).
// Each architecture (llama, gemma3, qwen2: engine/model_families.cpp) is only a reader
// that fills this description from the file; any other architecture is an error.
// Weights are views into the mapped file (quantized blocks stay as they are — there is
// no fp32 copy). The Model owns the GgufFile, so every Weight::data pointer lives as long
// as the Model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "common/status.h"
#include "engine/tokenizer.h"

namespace kvscope {

// RoPE pairing: Adjacent rotates (x[2i], x[2i+1]) (llama files); NeoX rotates
// (x[i], x[i + n_rot/2]) (gemma3, qwen2). Both by theta_i = pos * freq_scale * base^(-2i/n_rot).
enum class RopeStyle { Adjacent, NeoX };
const char* rope_style_name(RopeStyle s);  // "adjacent", "neox"
// FFN gate: out = act(Wgate·h) ⊙ (Wup·h) with SiLU (llama, qwen2) or tanh-approximated
// GELU (gemma3): 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).
enum class FfnAct { Silu, GeluTanh };
const char* ffn_act_name(FfnAct a);  // "silu", "gelu_tanh"

// What one block does that may differ between layers.
struct LayerConfig {
  int window = 0;               // sliding window W: a query sees the last W positions (0: all)
  float rope_base = 10000.0f;   // RoPE base
  float rope_freq_scale = 1.0f; // positions times this before rotating (linear scaling)
};

// Shape letters used everywhere: T tokens, L layers, H heads, Hkv kv heads, D head dim,
// C embedding width, F ffn width, V vocab. The attention width H·D need not equal C.
struct ModelConfig {
  std::string arch;        // "llama", "gemma3", "qwen2"
  std::string name;        // general.name, or the file name
  int n_layer = 0;         // L
  int n_embd = 0;          // C
  int n_head = 0;          // H
  int n_head_kv = 0;       // Hkv (H % Hkv == 0)
  int head_dim = 0;        // D (attention.key_length, else C / H)
  int n_ff = 0;            // F
  int n_vocab = 0;         // V
  int n_ctx = 0;           // trained context length
  int n_rot = 0;           // rotary dims per head (<= D, even)
  float rms_eps = 1e-5f;
  RopeStyle rope_style = RopeStyle::Adjacent;
  FfnAct ffn_act = FfnAct::Silu;
  float embd_scale = 1.0f;  // x = token_embd[id] * embd_scale (gemma3: sqrt(C))
  float attn_scale = 1.0f;  // attention scores = q·k * attn_scale (usually 1/sqrt(D))
  // Which optional per-block tensors the family has (every block has them then):
  bool qkv_bias = false;        // q, k, v biases added after the projections (qwen2)
  bool qk_norm = false;         // RMSNorm of each q and k head before RoPE (gemma3)
  bool post_attn_norm = false;  // x += RMSNorm(Wo·a)·post_attention_norm (gemma3)
  bool post_ffn_norm = false;   // x += RMSNorm(ffn)·post_ffw_norm (gemma3)
  std::vector<LayerConfig> layers;  // [L]
  bool tied_output = false;  // output projection reuses token_embd
  int attn_width() const { return n_head * head_dim; }  // H·D
};

// A weight matrix with ne = {n_in, n_out}: n_out rows of n_in values; y[o] = dot(row o, x).
// Vectors (norm weights) have n_out == 1.
struct Weight {
  std::string name;
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const uint8_t* data = nullptr;  // inside the mapped file
  uint64_t row_bytes = 0;         // bytes per row of n_in values
  // Unique among the weights loaded by this process (0: a weight built by hand). A
  // backend may key data it derives from the weight, such as a re-laid-out copy, on it.
  uint64_t uid = 0;
};

// Optional weights (see ModelConfig's flags) have data == nullptr when the family has none.
struct LayerWeights {
  Weight attn_norm;       // [C]
  Weight wq;              // {C, H*D}
  Weight wk;              // {C, Hkv*D}
  Weight wv;              // {C, Hkv*D}
  Weight bq, bk, bv;      // [H*D], [Hkv*D], [Hkv*D]  (qkv_bias)
  Weight q_norm, k_norm;  // [D]                      (qk_norm)
  Weight wo;              // {H*D, C}
  Weight post_attn_norm;  // [C]                      (post_attn_norm)
  Weight ffn_norm;        // [C]
  Weight w_gate;          // {C, F}
  Weight w_up;            // {C, F}
  Weight w_down;          // {F, C}
  Weight post_ffn_norm;   // [C]                      (post_ffn_norm)
};

class Model {
 public:
  // Opens, validates and maps a GGUF of a supported architecture. Errors name the file,
  // the key or tensor, the value found and what was expected.
  static Expected<std::shared_ptr<Model>> load(const std::string& path);

  const ModelConfig& config() const { return cfg_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const GgufFile& file() const { return *file_; }
  const Weight& tok_embd() const { return tok_embd_; }  // {C, V}
  const Weight& output_norm() const { return output_norm_; }  // [C]
  const Weight& output() const { return output_; }  // {C, V}; token_embd when tied
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const std::string& path() const { return file_->path(); }
  // Multiply-adds of the weight matmuls for one token through all blocks (no LM head).
  uint64_t block_macs_per_token() const;
  uint64_t weight_bytes() const;  // bytes of all weight tensors in the file

 private:
  Model() = default;
  ModelConfig cfg_;
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  Weight tok_embd_, output_norm_, output_;
  std::vector<LayerWeights> layers_;
};

}  // namespace kvscope
