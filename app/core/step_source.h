// step_source.h — what the controller's worker advances: the live engine (a Session) or a
// recorded run (a run file, see replay_source.h).
//
// One interface, so play/pause/step/speed, the timeline, the scene and the panels behave the
// same for a live run and a replay. A source is used from one thread at a time (the
// controller's worker). ModelFacts are what the UI and the run file need to know about the
// model without touching the engine: its dimensions and its identity (file name, size,
// fingerprint), copied once when the source is made.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "app/core/finish_reason.h"
#include "engine/session.h"

namespace kvscope::app {

class RunFile;

struct ModelFacts {
  std::string name, arch, backend, kv_dtype = "f16";
  std::string file_name;     // base name of the GGUF file
  uint64_t file_bytes = 0;   // its size
  uint64_t fingerprint = 0;  // FNV-1a 64 of the whole file (model_fingerprint)
  int n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_embd = 0, n_vocab = 0, n_ctx = 0;
  uint64_t block_macs_per_token = 0;  // weight multiply-adds per token through all blocks
  uint64_t kv_bytes_per_token = 0;    // K and V of one position in every layer
  KvTypes kv_types;                   // the cache's element types (kv_dtype names them)
  // The model's own window per layer (0: global); empty when no layer has one, and in
  // recordings (their steps carry each layer's window instead).
  std::vector<int> layer_window;
  // Equal in what a run file records (everything above kv_types).
  bool operator==(const ModelFacts& o) const {
    auto key = [](const ModelFacts& f) {
      return std::tie(f.name, f.arch, f.backend, f.kv_dtype, f.file_name, f.file_bytes,
                      f.fingerprint, f.n_layer, f.n_head, f.n_head_kv, f.head_dim, f.n_embd,
                      f.n_vocab, f.n_ctx, f.block_macs_per_token, f.kv_bytes_per_token);
    };
    return key(*this) == key(o);
  }
};

// FNV-1a 64 over the bytes of the file at `path` (0 when it cannot be read).
uint64_t model_fingerprint(const std::string& path);
// The facts of a session's model and backend (reads the file once for the fingerprint).
ModelFacts facts_of(const Session& s);

class StepSource {
 public:
  virtual ~StepSource() = default;
  virtual const ModelFacts& facts() const = 0;
  // A recorded run: reset() restarts the recording with its own prompt, and mode, sampler
  // and max-token changes are refused (the recording decides them).
  virtual bool is_replay() const { return false; }

  // Starts a run. On error the previous run is left exactly as it was.
  virtual Status reset(const PromptSpec& prompt) = 0;
  virtual const PromptSpec& prompt() const = 0;  // of the current run
  virtual Expected<StepTrace> step() = 0;
  virtual bool done() const = 0;
  // Why the run ended: the engine's stop reason, the recording's END reason for a replay,
  // Running while it can go on.
  virtual FinishReason stop_reason() const = 0;

  virtual Status set_mode(CacheMode mode) = 0;
  virtual CacheMode mode() const = 0;
  virtual Status set_sampler(const SamplerConfig& s) = 0;
  virtual const SamplerConfig& sampler() const = 0;
  virtual Status set_max_tokens(int n) = 0;
  virtual int max_tokens() const = 0;
  // Measure the quantization error of the K/V rows each later step writes (the engine's
  // SessionConfig::kv_errors); a recording has what it recorded.
  virtual void set_kv_errors(bool on) { (void)on; }

  // Another live source on the same model, a backend of the same kind (its own scratch and
  // cache) and the same settings and sampler, in `mode`: the second run of an interleaved
  // comparison. Error for a recording.
  virtual Expected<std::unique_ptr<StepSource>> twin(CacheMode mode) const {
    (void)mode;
    return make_error("a recorded run cannot be run again in another mode");
  }

  // Replay only: the run file being played and the byte offset of step `step` (1-based)
  // in it, so the timeline reads history straight from the recording.
  virtual std::shared_ptr<RunFile> recording() const { return nullptr; }
  virtual uint64_t step_offset(int step) const {
    (void)step;
    return ~uint64_t(0);
  }
};

// The live engine. `facts` are computed with facts_of(*session) when not given.
std::unique_ptr<StepSource> make_session_source(std::unique_ptr<Session> session);
std::unique_ptr<StepSource> make_session_source(std::unique_ptr<Session> session, ModelFacts facts);

}  // namespace kvscope::app
