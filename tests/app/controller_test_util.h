// controller_test_util.h — sources and helpers shared by the controller tests: the real
// default model, a tiny random-weight model written on the fly (fast: thousands of steps in
// seconds), a source that makes every step take a fixed time, and event collection.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "app/core/controller.h"
#include "app/core/engine_setup.h"
#include "app/core/step_source.h"
#include "app/core/timeline.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/util/tiny_model.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVSCOPE_TEST_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVSCOPE_TEST_SANITIZER_ALLOCATOR 1
#endif
#endif
#if defined(KVSCOPE_TEST_SANITIZER_ALLOCATOR)
// The sanitizer runtimes' public allocator interface (<sanitizer/allocator_interface.h>,
// which GCC does not install), declared here.
extern "C" size_t __sanitizer_get_current_allocated_bytes(void);
#endif

namespace kvscope::app::testing {

inline const PromptSpec kStory{"Once upon a time, in a kingdom far away,", false};
inline const PromptSpec kCode{"def add(a, b):\n    return", false};

// Under ThreadSanitizer the engine runs ~25x slower and the sanitizer's allocator neither
// returns freed pages nor reports RSS the way the C library does: the history test then runs
// a shorter run and checks its budgets on the sanitizer's heap count (sanitizer_heap_bytes).
#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif
#else
constexpr bool kTsan = false;
#endif
// AddressSanitizer keeps freed memory in quarantine, so RSS budgets cannot be checked there
// either (the sanitizer's heap count and the timeline's own accounting still are).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

// Under ASan or TSan, the heap bytes the program holds now, by the sanitizer runtime's own
// count; nullopt where the C library's allocator is in use. The sanitizers' allocators keep
// freed memory in quarantine or never return it, so resident memory means nothing there;
// this count means there what RSS means with the C library's allocator, so a memory budget
// keeps its meaning in every CI stage.
inline std::optional<uint64_t> sanitizer_heap_bytes() {
#if defined(KVSCOPE_TEST_SANITIZER_ALLOCATOR)
  return uint64_t(__sanitizer_get_current_allocated_bytes());
#else
  return std::nullopt;
#endif
}

// A tiny llama (random weights) as a live source. Never stops at EOS, so a run has exactly
// max_tokens steps.
inline std::unique_ptr<StepSource> tiny_source(int max_tokens, int n_ctx = 512, int n_layer = 2,
                                               int n_head = 4) {
  test::TinyModelSpec spec;
  spec.n_layer = n_layer;
  spec.n_head = n_head;
  spec.n_ctx = n_ctx;
  const std::string path = ::testing::TempDir() + "/kvscope_tiny_" + std::to_string(n_ctx) + "_" +
                           std::to_string(n_layer) + "_" + std::to_string(n_head) + ".gguf";
  if (!std::filesystem::exists(path)) {
    Status st = test::write_tiny_llama(spec, path);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  auto model = Model::load(path);
  EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().message);
  if (!model.ok()) return nullptr;
  SessionConfig cfg;
  cfg.max_tokens = max_tokens;
  cfg.stop_at_eos = false;
  auto s = Session::create(model.value(), make_cpu_backend(1), cfg);
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return nullptr;
  return make_session_source(std::move(s.value()));
}

// The default model on the CPU with one thread, or nullptr when it is absent.
inline std::unique_ptr<Session> default_session(int max_tokens) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) return nullptr;
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  // One engine thread: these tests are about the controller's threads; the CPU backend's
  // own pool is covered by the engine tests (and is invisible to TSan unless the engine
  // itself is built with -fsanitize=thread).
  eo.threads = 1;
  eo.max_tokens = max_tokens;
  auto eng = open_engine(eo);
  EXPECT_TRUE(eng.ok()) << (eng.ok() ? "" : eng.error().message);
  if (!eng.ok()) return nullptr;
  return std::move(eng.value().session);
}

// A source that hands every call to `inner`; test wrappers override what they change.
class ForwardingSource : public StepSource {
 public:
  explicit ForwardingSource(std::unique_ptr<StepSource> inner) : inner_(std::move(inner)) {}
  const ModelFacts& facts() const override { return inner_->facts(); }
  Status reset(const PromptSpec& p) override { return inner_->reset(p); }
  const PromptSpec& prompt() const override { return inner_->prompt(); }
  Expected<StepTrace> step() override { return inner_->step(); }
  bool done() const override { return inner_->done(); }
  FinishReason stop_reason() const override { return inner_->stop_reason(); }
  Status set_mode(CacheMode m) override { return inner_->set_mode(m); }
  CacheMode mode() const override { return inner_->mode(); }
  Status set_sampler(const SamplerConfig& s) override { return inner_->set_sampler(s); }
  const SamplerConfig& sampler() const override { return inner_->sampler(); }
  Status set_max_tokens(int n) override { return inner_->set_max_tokens(n); }
  int max_tokens() const override { return inner_->max_tokens(); }

 protected:
  std::unique_ptr<StepSource> inner_;
};

// Wraps a source so that every step takes at least `step_ms` (a stand-in for a long
// NO CACHE step, without burning minutes of CPU; 0: as fast as the inner source), and counts
// the steps it was asked for: the latency tests check how many ran after a Stop or a close
// (a logical property a busy machine cannot break), not how long they took.
class SlowSource final : public ForwardingSource {
 public:
  SlowSource(std::unique_ptr<StepSource> inner, int step_ms)
      : ForwardingSource(std::move(inner)), step_ms_(step_ms) {}
  Expected<StepTrace> step() override {
    steps_->fetch_add(1);
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(step_ms_);
    auto t = inner_->step();
    std::this_thread::sleep_until(until);
    return t;
  }
  // Steps started so far; the counter outlives the source (the controller owns the source).
  std::shared_ptr<const std::atomic<int>> steps_started() const { return steps_; }

 private:
  int step_ms_;
  std::shared_ptr<std::atomic<int>> steps_ = std::make_shared<std::atomic<int>>(0);
};

inline ControllerOptions test_options() {
  ControllerOptions o;
  o.spool_dir = ::testing::TempDir() + "/kvscope_spool";
  return o;
}

// Collects events until `pred(all events so far)` holds or `seconds` pass.
template <class Pred>
void collect(Controller& c, std::vector<Event>& all, Pred pred, double seconds = 60) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred(all) && std::chrono::steady_clock::now() < until)
    for (Event& e : c.wait_events(20)) all.push_back(std::move(e));
}

inline int count_kind(const std::vector<Event>& ev, Event::Kind k, uint64_t run) {
  int n = 0;
  for (const Event& e : ev) n += e.kind == k && e.run == run;
  return n;
}
inline int count_steps(const std::vector<Event>& ev, uint64_t run) {
  return count_kind(ev, Event::Kind::Step, run);
}
inline bool finished(const std::vector<Event>& ev, uint64_t run) {
  return count_kind(ev, Event::Kind::Finished, run) > 0;
}

// Plays the story on `src` at full speed until its first run finishes; every event, in order.
inline std::vector<Event> play_story_to_end(std::unique_ptr<StepSource> src) {
  auto ctl = std::make_unique<Controller>(std::move(src), test_options());
  std::vector<Event> ev;
  ctl->send(CmdSpeed{kSpeedMax});
  ctl->send(CmdReset{kStory, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 1); });
  EXPECT_TRUE(finished(ev, 1));
  return ev;
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace kvscope::app::testing
