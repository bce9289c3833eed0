// replay_source.cpp — stepping through a run file (see replay_source.h).
#include "app/core/replay_source.h"

namespace kvscope::app {
namespace {

class ReplaySource final : public StepSource {
 public:
  explicit ReplaySource(std::shared_ptr<RunFile> f) : file_(std::move(f)) {
    facts_ = file_->meta().model;
    mode_ = file_->meta().mode;
  }
  const ModelFacts& facts() const override { return facts_; }
  bool is_replay() const override { return true; }
  Status reset(const PromptSpec&) override {
    next_ = 0;
    mode_ = file_->meta().mode;
    return Status::Ok();
  }
  const PromptSpec& prompt() const override { return file_->meta().prompt; }
  Expected<StepTrace> step() override {
    if (done())
      return make_error("replay: the recording has no more steps (", file_->end().steps,
                        "); reset to play it again");
    auto t = file_->read_step(file_->step_offsets()[next_]);
    if (!t.ok()) return t.error();
    ++next_;
    mode_ = t->mode;
    return t;
  }
  bool done() const override { return next_ >= file_->step_offsets().size(); }
  FinishReason stop_reason() const override {
    if (!done()) return FinishReason::Running;
    // decode_end refused any name that is not a FinishReason's.
    return finish_reason_from_string(file_->end().reason).value_or(FinishReason::Running);
  }
  Status set_mode(CacheMode m) override {
    if (m == mode_) return Status::Ok();
    return make_error(
        "replay: the recording decides the cache mode of each step; open the "
        "model to run it again in another mode");
  }
  CacheMode mode() const override { return mode_; }
  Status set_sampler(const SamplerConfig&) override {
    return make_error("replay: sampling settings belong to the recording");
  }
  const SamplerConfig& sampler() const override { return file_->meta().sampler; }
  Status set_max_tokens(int) override {
    return make_error("replay: the recording has a fixed number of steps");
  }
  int max_tokens() const override { return file_->meta().max_tokens; }
  std::shared_ptr<RunFile> recording() const override { return file_; }
  uint64_t step_offset(int step) const override {
    const auto& o = file_->step_offsets();
    return step >= 1 && size_t(step) <= o.size() ? o[size_t(step) - 1] : kNoOffset;
  }

 private:
  std::shared_ptr<RunFile> file_;
  ModelFacts facts_;
  CacheMode mode_ = CacheMode::Cache;
  size_t next_ = 0;
};

}  // namespace

std::unique_ptr<StepSource> make_replay_source(std::shared_ptr<RunFile> file) {
  return std::make_unique<ReplaySource>(std::move(file));
}

Expected<std::unique_ptr<StepSource>> open_replay(const std::string& path) {
  auto f = RunFile::open(path);
  if (!f.ok()) return f.error();
  return make_replay_source(std::move(f.value()));
}

}  // namespace kvscope::app
