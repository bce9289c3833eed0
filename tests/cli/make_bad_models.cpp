// make_bad_models.cpp — writes the model files the CLI bad-input test feeds to kvscope:
//   DIR/corrupt.gguf      the first 4 KiB of a valid model with its magic damaged
//   DIR/truncated.gguf    a valid tiny model cut off in the middle of its tensor data
//   DIR/unsupported.gguf  a llama model whose layer matrices are Q2_K (not supported)
//   DIR/tiny.gguf         a valid tiny random-weight llama model
#include <cstdio>
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
  bool ok = write(dir + "/tiny.gguf", tiny) && write(dir + "/corrupt.gguf", corrupt) &&
            write(dir + "/truncated.gguf", truncated) &&
            write(dir + "/unsupported.gguf", test::tiny_llama(k).build());
  return ok ? 0 : 1;
}
