// fuzz_tokenizer.cpp — libFuzzer entry point for the tokenizers.
//
// Loads, once, the default model's byte-level BPE tokenizer (KVSCOPE_DEFAULT_MODEL) and,
// when it is fetched, Gemma 3's SentencePiece-style one (assets/models/
// gemma-3-270m-q4_k_m.gguf); without the default model every input is a no-op. Each
// input is encoded by each tokenizer with and without special-token parsing. Invalid
// UTF-8 must be rejected with an error, never crash; for valid UTF-8 every id must be
// inside the vocabulary (and never UNK for SentencePiece), decoding must give back the
// input (BPE: less the few bytes the vocabulary has no token for, which encoding drops as
// llama.cpp does; SentencePiece: with U+2581 read as a space), and streaming the token
// bytes must give the same text. A violation aborts so the fuzzer records the input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

namespace {

struct Loaded {
  std::unique_ptr<kvscope::GgufFile> file;
  std::unique_ptr<kvscope::Tokenizer> tok;
  bool byte_has_token[256] = {};  // bytes with a single-byte token; others are dropped
  bool spm = false;
};

Loaded load(const std::string& path) {
  Loaded out;
  if (!std::filesystem::exists(path)) return out;
  auto file = kvscope::GgufFile::open(path);
  if (!file) return out;
  auto tok = kvscope::Tokenizer::from_gguf(**file);
  if (!tok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", tok.error().message.c_str());
    std::abort();
  }
  out.file = std::move(*file);
  out.tok = std::move(*tok);
  out.spm = out.tok->model_name() == "llama";
  for (int32_t id = 0; id < out.tok->n_vocab(); ++id) {
    const std::string b = out.tok->token_bytes(id);
    if (b.size() == 1 && !out.tok->is_control(id)) out.byte_has_token[uint8_t(b[0])] = true;
  }
  return out;
}

const std::vector<Loaded>& loaded() {
  static const std::vector<Loaded> all = [] {
    std::vector<Loaded> v;
    for (const std::string& path :
         {std::string(KVSCOPE_DEFAULT_MODEL),
          std::string(KVSCOPE_SOURCE_DIR) + "/assets/models/gemma-3-270m-q4_k_m.gguf"}) {
      Loaded l = load(path);
      if (l.tok) v.push_back(std::move(l));
    }
    return v;
  }();
  return all;
}

[[noreturn]] void fail(const Loaded& l, const char* what, std::string_view input) {
  std::fprintf(stderr, "fuzz_tokenizer (%s): %s (input of %zu bytes)\n",
               l.tok->model_name().c_str(), what, input.size());
  std::abort();
}

// What decoding must give back.
std::string expected_text(const Loaded& l, std::string_view text) {
  std::string want;
  if (l.spm) {
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
        want += ' ';
        i += 2;
      } else {
        want += text[i];
      }
    }
    return want;
  }
  for (char c : text)
    if (l.byte_has_token[static_cast<uint8_t>(c)]) want += c;
  return want;
}

void check(const Loaded& l, std::string_view text, bool valid) {
  const std::string want = expected_text(l, text);
  for (bool special : {false, true}) {
    auto ids = l.tok->encode(text, special);
    if (!valid) {
      if (ids.ok()) fail(l, "invalid UTF-8 was accepted", text);
      continue;
    }
    if (!ids.ok()) {
      std::fprintf(stderr, "%s\n", ids.error().message.c_str());
      fail(l, "valid UTF-8 was rejected", text);
    }
    for (int32_t id : *ids) {
      if (id < 0 || id >= l.tok->n_vocab()) fail(l, "id outside the vocabulary", text);
      if (l.spm && l.tok->token_str(id) == "<unk>" && text.find("<unk>") == std::string::npos)
        fail(l, "UNK produced", text);
    }
    if (l.tok->decode(*ids) != want) fail(l, "decode(encode(x)) != x", text);
  }
  if (!valid) return;
  // Streaming the token bytes of the input must give back the same text.
  auto ids = l.tok->encode(text, false);
  kvscope::Utf8Stream stream;
  std::string streamed;
  for (int32_t id : *ids) {
    const std::string piece = stream.push(l.tok->token_bytes(id));
    if (!kvscope::utf8_valid(piece)) fail(l, "stream emitted half a character", text);
    streamed += piece;
  }
  streamed += stream.flush();
  // Dropped lead bytes can leave stray continuation bytes, which streaming replaces by
  // U+FFFD: piecewise streaming must still equal streaming everything at once.
  kvscope::Utf8Stream whole;
  const std::string want_streamed = whole.push(want) + whole.flush();
  if (kvscope::utf8_valid(want) && want_streamed != want)
    fail(l, "stream altered valid text", text);
  if (streamed != want_streamed) fail(l, "streamed text differs from the input", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool valid = kvscope::utf8_valid(text);
  for (const Loaded& l : loaded()) check(l, text, valid);
  return 0;
}
