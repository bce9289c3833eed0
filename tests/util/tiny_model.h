// tiny_model.h — builds small random-weight llama GGUF files for tests.
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
  int n_layer = 2;
  int n_embd = 64;    // C
  int n_head = 4;     // H (head_dim = C / H)
  int n_head_kv = 2;  // Hkv
  int n_ff = 96;      // F
  int n_ctx = 256;
  GgmlType matrix_type = GgmlType::Q4_1;
  GgmlType embd_type = GgmlType::Q8_0;
  uint32_t seed = 1;
};

GgufWriter tiny_llama(const TinyModelSpec& spec);
// Writes tiny_llama(spec) to `path`.
Status write_tiny_llama(const TinyModelSpec& spec, const std::string& path);

}  // namespace kvscope::test
