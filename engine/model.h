// model.h — a llama-architecture model read from a GGUF file.
//
// ModelConfig comes from the file's metadata; Weights are views into the mapped file
// (quantized blocks stay as they are — there is no fp32 copy). The Model owns the
// GgufFile, so every Weight::data pointer lives as long as the Model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "engine/status.h"
#include "engine/tokenizer.h"

namespace kvscope {

// Shape letters used everywhere: T tokens, L layers, H heads, Hkv kv heads, D head dim,
// C embedding width, F ffn width, V vocab.
struct ModelConfig {
  std::string arch;        // "llama"
  std::string name;        // general.name, or the file name
  int n_layer = 0;         // L
  int n_embd = 0;          // C
  int n_head = 0;          // H
  int n_head_kv = 0;       // Hkv (H % Hkv == 0)
  int head_dim = 0;        // D = C / H
  int n_ff = 0;            // F
  int n_vocab = 0;         // V
  int n_ctx = 0;           // trained context length
  int n_rot = 0;           // rotary dims per head (<= D, even)
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  bool tied_output = false;  // output projection reuses token_embd
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

struct LayerWeights {
  Weight attn_norm;  // [C]
  Weight wq;         // {C, H*D}
  Weight wk;         // {C, Hkv*D}
  Weight wv;         // {C, Hkv*D}
  Weight wo;         // {H*D, C}
  Weight ffn_norm;   // [C]
  Weight w_gate;     // {C, F}
  Weight w_up;       // {C, F}
  Weight w_down;     // {F, C}
};

class Model {
 public:
  // Opens, validates and maps a llama-architecture GGUF. Errors name the file, the
  // key or tensor, the value found and what was expected.
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
