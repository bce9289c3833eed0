// model_families.h — the architecture readers: each fills the model description
// (ModelConfig, engine/model.h) from a GGUF file's metadata. Facts per family:
// docs/engine.md ("Model families"); every value the file has is read from the file.
#pragma once

#include "engine/gguf.h"
#include "engine/model.h"
#include "common/status.h"

namespace kvscope {

// The architectures kvscope runs, for messages: "llama, gemma3 and qwen2".
const char* supported_architectures();

// Fills everything in `c` but name, n_vocab and tied_output from general.architecture and
// the <arch>.* keys. An unknown architecture, a missing or out-of-range key, a window
// larger than the context or a feature kvscope does not run (logit softcapping, RoPE
// scaling other than linear) is an Error naming the file and key.
Status read_model_config(const GgufFile& f, ModelConfig& c);

}  // namespace kvscope
