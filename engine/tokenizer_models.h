// tokenizer_models.h — the tokenizer models behind the Tokenizer interface (internal to
// the engine). Tokenizer::from_gguf reads the shared Vocab, then hands it to the model
// named by tokenizer.ggml.model. `where` prefixes every error ("tokenizer (PATH): ").
#pragma once

#include <memory>
#include <string>

#include "engine/gguf.h"
#include "common/status.h"
#include "engine/tokenizer.h"

namespace kvscope {

// tokenizer.ggml.model "gpt2": byte-level BPE with the pre-tokenizer tokenizer.ggml.pre.
Expected<std::unique_ptr<Tokenizer>> make_bpe_tokenizer(const GgufFile& file,
                                                        const std::string& where, Vocab vocab);
// tokenizer.ggml.model "llama": SentencePiece-style merges by score, byte fallback.
Expected<std::unique_ptr<Tokenizer>> make_spm_tokenizer(const GgufFile& file,
                                                        const std::string& where, Vocab vocab);

// Sets `dst` from the boolean key when the file has it; leaves it as is otherwise.
Status read_optional_bool(const GgufFile& file, const std::string& where, const char* key,
                          bool& dst);

}  // namespace kvscope
