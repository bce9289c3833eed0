// run_codec.h — the payloads of the run file's records (META, STEP, END) to and from bytes.
//
// The container (file header, record framing, checksums) is run_file.h; the byte layout of
// every field is documented in docs/run_file.md. Little-endian, fixed-width integers,
// strings as u32 length + bytes. Decoders check every count against the bytes that are
// really there before using it and every value against its allowed range; an error names
// the field, the value and the range. They never trust a length from the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "app/core/finish_reason.h"
#include "app/core/step_source.h"
#include "engine/session.h"
#include "common/status.h"

namespace kvscope::app {

// How a STEP record stores the attention rows (a file-wide default in META; each step says
// its own, since the app's spool drops attention past its disk cap).
enum class AttnEncoding : uint8_t { F32 = 0, F16 = 1, None = 2 };
const char* attn_encoding_name(AttnEncoding e);  // "f32", "f16", "none"

// Ranges the decoder accepts (far above any real model; they bound allocations).
inline constexpr int64_t kRunMaxLayers = 4096;        // L, H
inline constexpr int64_t kRunMaxPositions = 1 << 24;  // positions, tokens, steps
inline constexpr int64_t kRunMaxCandidates = 4096;
inline constexpr uint64_t kRunMaxString = 64ull << 20;  // bytes of one string

// The META record: everything about a run that is not a step.
struct RunMeta {
  std::string producer;  // "kvscope 0.1.0"
  ModelFacts model;
  PromptSpec prompt;
  CacheMode mode = CacheMode::Cache;  // at the start of the run (each step has its own)
  SamplerConfig sampler;              // at the start of the run
  int max_tokens = 0;
  AttnEncoding attention = AttnEncoding::F16;
  bool operator==(const RunMeta& o) const;
};

// The END record: how the run ended (or "running" when saved mid-run). The reason is a
// FinishReason's name (to_string / finish_reason_from_string in finish_reason.h); decode_end
// refuses any other.
struct RunEnd {
  int steps = 0;
  std::string reason;  // eos, max_tokens, stop_string, context_full, stopped, error, running
};

// CRC-32 (IEEE 802.3, reflected, the one zlib and PNG use) of n bytes, continuing `crc`.
uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);

std::vector<uint8_t> encode_meta(const RunMeta& m);
// `enc` None drops the attention rows (the step keeps everything else).
std::vector<uint8_t> encode_step(const StepTrace& t, AttnEncoding enc);
std::vector<uint8_t> encode_end(const RunEnd& e);

Expected<RunMeta> decode_meta(const uint8_t* p, size_t n);
Expected<StepTrace> decode_step(const uint8_t* p, size_t n);
Expected<RunEnd> decode_end(const uint8_t* p, size_t n);

}  // namespace kvscope::app
