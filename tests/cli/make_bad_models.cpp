// make_bad_models.cpp — writes the model files the CLI bad-input test feeds to kvscope:
//   DIR/corrupt.gguf      the first 4 KiB of a valid model with its magic damaged
//   DIR/truncated.gguf    a valid tiny model cut off in the middle of its tensor data
//   DIR/unsupported.gguf  a llama model whose layer matrices are Q2_K (not supported)
//   DIR/tiny.gguf         a valid tiny random-weight llama model
//   DIR/escape_arch.gguf  an architecture name with a terminal escape sequence and a NUL
//   DIR/escape_tensor.gguf  a duplicate tensor name with a NUL and an escape sequence
//   DIR/overlap.gguf      the tiny model with two tensors sharing their data bytes
//   DIR/context.gguf      the tiny model with a context length of 2^24
//   DIR/head_dim.gguf     the tiny model with an attention.key_length its shapes contradict
//   DIR/gemma3.gguf       a valid tiny gemma3 model (windows of 5 on two of its 3 layers)
//   DIR/qwen2.gguf        a valid tiny qwen2 model (q/k/v biases, NeoX RoPE)
//   DIR/mamba.gguf        the tiny model with an architecture kvscope does not run
//   DIR/no_k_norm.gguf    the tiny gemma3 model without blk.1.attn_k_norm.weight
//   DIR/wide_window.gguf  the tiny gemma3 model with a window of 300 in a context of 256
#include <cstdio>
#include <cstring>
#include <fstream>

#include "tests/util/tiny_model.h"

using namespace kvscope;

static bool write(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return bool(out);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_bad_models DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  test::TinyModelSpec spec;
  std::vector<uint8_t> tiny = test::tiny_llama(spec).build();
  std::vector<uint8_t> corrupt(tiny.begin(), tiny.begin() + std::min<size_t>(4096, tiny.size()));
  corrupt[0] = 'X';
  std::vector<uint8_t> truncated(tiny.begin(), tiny.begin() + tiny.size() * 3 / 4);
  test::TinyModelSpec k = spec;
  k.n_embd = 256;
  k.n_ff = 256;
  k.matrix_type = GgmlType::Q2_K;

  const std::string escape("\x1b[2J\x1b]0;owned\x07", 14);
  test::GgufWriter arch;
  arch.add_string("general.architecture", "ll" + escape + std::string(1, '\0') + "ama");
  test::GgufWriter tensor;
  tensor.add_string("general.architecture", "llama");
  const std::string name = "w" + std::string(1, '\0') + "x" + escape;
  tensor.add_tensor_f32(name, {4}, {1, 2, 3, 4});
  tensor.add_tensor_f32(name, {4}, {1, 2, 3, 4});

  // Point blk.0.attn_q.weight (tensor 2) at the bytes of blk.0.attn_norm.weight (tensor 1).
  test::GgufLayout layout;
  std::vector<uint8_t> overlap = test::tiny_llama(spec).build(&layout);
  uint64_t first_offset = 0;
  std::memcpy(&first_offset, overlap.data() + layout.tensor_fields[1].offset, 8);
  std::memcpy(overlap.data() + layout.tensor_fields[2].offset, &first_offset, 8);

  test::TinyModelSpec long_ctx = spec;
  long_ctx.n_ctx = 1 << 24;
  test::GgufWriter head_dim = test::tiny_llama(spec);
  head_dim.add_u32("llama.attention.key_length", 32);  // the shapes say 64 / 4 = 16

  test::TinyModelSpec mamba = spec;
  mamba.arch = "mamba";
  const test::TinyModelSpec gemma3 = test::tiny_family("gemma3", 3);
  test::TinyModelSpec no_k_norm = gemma3;
  no_k_norm.skip_tensor = "blk.1.attn_k_norm.weight";
  test::TinyModelSpec wide_window = gemma3;
  wide_window.window = 300;

  bool ok = write(dir + "/tiny.gguf", tiny) && write(dir + "/corrupt.gguf", corrupt) &&
            write(dir + "/truncated.gguf", truncated) &&
            write(dir + "/unsupported.gguf", test::tiny_llama(k).build()) &&
            write(dir + "/escape_arch.gguf", arch.build()) &&
            write(dir + "/escape_tensor.gguf", tensor.build()) &&
            write(dir + "/overlap.gguf", overlap) &&
            write(dir + "/context.gguf", test::tiny_llama(long_ctx).build()) &&
            write(dir + "/head_dim.gguf", head_dim.build()) &&
            write(dir + "/gemma3.gguf", test::tiny_model(gemma3).build()) &&
            write(dir + "/qwen2.gguf", test::tiny_model(test::tiny_family("qwen2", 4)).build()) &&
            write(dir + "/mamba.gguf", test::tiny_model(mamba).build()) &&
            write(dir + "/no_k_norm.gguf", test::tiny_model(no_k_norm).build()) &&
            write(dir + "/wide_window.gguf", test::tiny_model(wide_window).build());
  return ok ? 0 : 1;
}
