// step_source.cpp — the live engine as a StepSource, and the model's facts and identity.
#include "app/core/step_source.h"

#include "engine/bootstrap/bootstrap.h"
#include "engine/kv_memory.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

namespace kvscope::app {

namespace {

// FNV-1a 64 over a private buffer: nothing here is shared between threads, so the thread
// sanitizer's per-byte checks (which make hashing a model file take tens of seconds) are
// left out of this one loop.
#if defined(__clang__)
__attribute__((no_sanitize("thread")))
#elif defined(__GNUC__)
__attribute__((no_sanitize_thread))
#endif
uint64_t
fnv1a_update(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

uint64_t model_fingerprint(const std::string& path) {
  // A file is hashed once per process (keyed by path, size and modification time).
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  const std::string key = path + "|" + std::to_string(size) + "|" + std::to_string(mtime);
  static std::mutex mu;
  static std::map<std::string, uint64_t> known;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h = fnv1a_update(h, buf.data(), n);
  std::fclose(f);
  std::lock_guard<std::mutex> lock(mu);
  known[key] = h;
  return h;
}

ModelFacts facts_of(const Session& s) {
  ModelFacts f;
  const Model& m = s.model();
  const ModelConfig& c = m.config();
  f.name = c.name;
  f.arch = c.arch;
  f.backend = s.backend().name();
  f.file_name = std::filesystem::path(m.path()).filename().string();
  f.file_bytes = m.file().file_size();
  f.fingerprint = model_fingerprint(m.path());
  f.n_layer = c.n_layer;
  f.n_head = c.n_head;
  f.n_head_kv = c.n_head_kv;
  f.head_dim = c.head_dim;
  f.n_embd = c.n_embd;
  f.n_vocab = c.n_vocab;
  f.n_ctx = c.n_ctx;
  f.block_macs_per_token = m.block_macs_per_token();
  const KvTypes kt = s.config().kv_types;
  f.kv_dtype = kv_types_name(kt);
  f.kv_types = kt;
  f.layer_window = kv_memory_shape(m).layer_window;
  f.kv_bytes_per_token =
      uint64_t(c.n_layer) * kv_position_bytes(KvShape{c.n_layer, c.n_head_kv, c.head_dim}, kt);
  return f;
}

namespace {

class SessionSource final : public StepSource {
 public:
  SessionSource(std::unique_ptr<Session> s, ModelFacts f)
      : session_(std::move(s)), facts_(std::move(f)) {}
  const ModelFacts& facts() const override { return facts_; }
  Status reset(const PromptSpec& prompt) override {
    KV_TRY(session_->reset(prompt));
    prompt_ = prompt;
    return Status::Ok();
  }
  const PromptSpec& prompt() const override { return prompt_; }
  Expected<StepTrace> step() override { return session_->step(); }
  bool done() const override { return session_->done(); }
  FinishReason stop_reason() const override { return finish_reason_of(session_->stop_reason()); }
  Status set_mode(CacheMode mode) override { return session_->set_mode(mode); }
  CacheMode mode() const override { return session_->mode(); }
  Status set_sampler(const SamplerConfig& s) override {
    session_->set_sampler(s);
    return Status::Ok();
  }
  const SamplerConfig& sampler() const override { return session_->sampler(); }
  Status set_max_tokens(int n) override {
    session_->set_max_tokens(n);
    return Status::Ok();
  }
  int max_tokens() const override { return session_->config().max_tokens; }
  Expected<std::unique_ptr<StepSource>> twin(CacheMode mode) const override {
    // The same kind of backend, on the CPU with as many threads.
    const Backend& own = session_->backend();
    auto backend = make_backend(own.kind(), session_->model(), own.threads(), nullptr);
    if (!backend.ok()) return backend.error();
    SessionConfig cfg = session_->config();
    cfg.mode = mode;
    auto s = Session::create(session_->shared_model(), std::move(backend.value()), cfg);
    if (!s.ok()) return s.error();
    s.value()->set_sampler(session_->sampler());
    ModelFacts facts = facts_;
    facts.backend = s.value()->backend().name();  // its own (of the same kind and threads)
    return std::unique_ptr<StepSource>(
        std::make_unique<SessionSource>(std::move(s.value()), std::move(facts)));
  }
  void set_kv_errors(bool on) override { session_->set_kv_errors(on); }

 private:
  std::unique_ptr<Session> session_;
  ModelFacts facts_;
  PromptSpec prompt_;
};

}  // namespace

std::unique_ptr<StepSource> make_session_source(std::unique_ptr<Session> session) {
  ModelFacts f = facts_of(*session);
  return make_session_source(std::move(session), std::move(f));
}

std::unique_ptr<StepSource> make_session_source(std::unique_ptr<Session> session,
                                                ModelFacts facts) {
  return std::make_unique<SessionSource>(std::move(session), std::move(facts));
}

}  // namespace kvscope::app
