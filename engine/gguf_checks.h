// gguf_checks.h — checks GgufFile::parse runs once every field has been read and bounds
// checked: no two tensors share bytes, and well-known metadata values are sane. Each error
// names the file, the key or tensors, the value and the allowed range.
#pragma once

#include <string>
#include <vector>

#include "engine/gguf.h"
#include "common/status.h"

namespace kvscope {

// Tensor data ranges (offset, nbytes within the data section) must not overlap: a writer
// never shares bytes between tensors, so overlap means a corrupted offset.
Status check_tensor_layout(const std::vector<TensorInfo>& tensors, const std::string& file);

// For the file's architecture (general.architecture = A): numeric values of the keys
// A.context_length, A.block_count, A.embedding_length, A.feed_forward_length,
// A.attention.head_count(_kv), A.attention.key_length / value_length,
// A.rope.dimension_count, A.attention.sliding_window, A.vocab_size and the norm epsilons,
// RoPE base and soft-caps must lie in generous but finite ranges (floats finite). For the
// architectures whose attention kvscope reads (llama, qwen2, gemma3) the head dimension —
// A.attention.key_length, else embedding_length / head_count — and value_length must be
// what every layer's q/k/v projection shapes say, and rope.dimension_count at most that.
// Keys with another type are left to the readers, which name the expected type.
Status check_metadata_ranges(const GgufFile& f, const std::string& file);

}  // namespace kvscope
