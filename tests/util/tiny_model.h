// tiny_model.h — builds small random-weight GGUF files for tests: llama, gemma3 (NeoX
// RoPE, Q/K norm, post norms, GELU gate, sliding windows, attention width != C) and qwen2
// (q/k/v biases, NeoX RoPE), or any other architecture name (for error tests).
//
// The vocabulary is byte-level: the three ChatML control tokens, then one token per byte
// (GPT-2 byte-to-unicode mapped), then a few merges, so any UTF-8 text tokenizes. Weights
// are deterministic pseudo-random values from `seed`, quantized to `matrix_type`
// (layer matrices) and `embd_type` (token embedding, also the tied LM head).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "tests/util/gguf_writer.h"

namespace kvscope::test {

struct TinyModelSpec {
  std::string arch = "llama";  // general.architecture; its keys are written as <arch>.*
  int n_layer = 2;
  int n_embd = 64;    // C
  int n_head = 4;     // H (head_dim = C / H)
  int n_head_kv = 2;  // Hkv
  int head_dim = 0;   // D; 0: C / H (else written as attention.key_length/value_length)
  int n_ff = 96;      // F
  int n_ctx = 256;
  float rope_base = 10000.0f;
  // gemma3: attention.sliding_window and, when not empty, attention.sliding_window_pattern
  // (true: local); without a pattern every 6th layer is global.
  int window = 0;
  std::vector<bool> swa_pattern;
  std::string skip_tensor;  // a tensor name left out of the file (error tests)
  GgmlType matrix_type = GgmlType::Q4_1;
  GgmlType embd_type = GgmlType::Q8_0;
  uint32_t seed = 1;
};

// The family examples the tests share: gemma3 — 3 layers (local, local, global by an
// explicit pattern), window 5, head_dim 24 with C = 64 and 4 heads (attention width 96),
// 1 kv head; qwen2 — the default shape with q/k/v biases; llama — the default spec.
TinyModelSpec tiny_family(const std::string& arch, uint32_t seed);

GgufWriter tiny_model(const TinyModelSpec& spec);
GgufWriter tiny_llama(const TinyModelSpec& spec);  // tiny_model with arch "llama"
// Writes tiny_model(spec) to `path`.
Status write_tiny_model(const TinyModelSpec& spec, const std::string& path);
Status write_tiny_llama(const TinyModelSpec& spec, const std::string& path);

}  // namespace kvscope::test
