// fuzz_tokenizer.cpp — libFuzzer entry point for the BPE tokenizer.
//
// Loads the default model's tokenizer once (path from KVSCOPE_DEFAULT_MODEL; without
// it every input is a no-op), then encodes each input with and without special-token
// parsing. Invalid UTF-8 must be rejected with an error, never crash; valid UTF-8 must
// decode back to exactly the input (less the few bytes the vocabulary has no token for,
// which encoding drops as llama.cpp does), and every id must be inside the vocabulary. A
// violation aborts so the fuzzer records the input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

namespace {

struct Loaded {
  std::unique_ptr<kvscope::GgufFile> file;
  std::unique_ptr<kvscope::Tokenizer> tok;
  bool byte_has_token[256] = {};  // bytes with a single-byte token; others are dropped
};

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded out;
    auto file = kvscope::GgufFile::open(KVSCOPE_DEFAULT_MODEL);
    if (!file) return out;
    auto tok = kvscope::Tokenizer::from_gguf(**file);
    if (!tok) return out;
    out.file = std::move(*file);
    out.tok = std::move(*tok);
    for (int32_t id = 0; id < out.tok->n_vocab(); ++id) {
      const std::string b = out.tok->token_bytes(id);
      if (b.size() == 1 && !out.tok->is_control(id)) out.byte_has_token[uint8_t(b[0])] = true;
    }
    return out;
  }();
  return l;
}

[[noreturn]] void fail(const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz_tokenizer: %s (input of %zu bytes)\n", what, input.size());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Loaded& l = loaded();
  if (!l.tok) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = kvscope::utf8_valid(text);
  // What decoding must give back: the input minus bytes the vocabulary cannot represent.
  std::string want;
  for (char c : text)
    if (l.byte_has_token[static_cast<uint8_t>(c)]) want += c;
  for (bool special : {false, true}) {
    auto ids = l.tok->encode(text, special);
    if (!valid) {
      if (ids.ok()) fail("invalid UTF-8 was accepted", text);
      continue;
    }
    if (!ids.ok()) {
      std::fprintf(stderr, "%s\n", ids.error().message.c_str());
      fail("valid UTF-8 was rejected", text);
    }
    for (int32_t id : *ids) {
      if (id < 0 || id >= l.tok->n_vocab()) fail("id outside the vocabulary", text);
    }
    if (l.tok->decode(*ids) != want) fail("decode(encode(x)) != x", text);
  }
  // Streaming the token bytes of the input must give back the same text.
  if (valid) {
    auto ids = l.tok->encode(text, false);
    kvscope::Utf8Stream stream;
    std::string streamed;
    for (int32_t id : *ids) {
      const std::string piece = stream.push(l.tok->token_bytes(id));
      if (!kvscope::utf8_valid(piece)) fail("stream emitted half a character", text);
      streamed += piece;
    }
    streamed += stream.flush();
    // Dropped lead bytes can leave stray continuation bytes, which streaming replaces by
    // U+FFFD: piecewise streaming must still equal streaming everything at once.
    kvscope::Utf8Stream whole;
    const std::string want_streamed = whole.push(want) + whole.flush();
    if (kvscope::utf8_valid(want) && want_streamed != want) fail("stream altered valid text", text);
    if (streamed != want_streamed) fail("streamed text differs from the input", text);
  }
  return 0;
}
