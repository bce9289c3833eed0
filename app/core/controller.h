// controller.h — owns the step source (the live Session, or a recording) on a worker thread.
//
// The UI thread never touches the source: it send()s commands and drains events with
// poll() once per frame. Neither call waits for the engine.
//
// Step boundaries: the worker runs one step at a time and, between two steps, applies every
// command that arrived meanwhile. So Stop, Reset, a mode, model or setting change and
// shutdown take effect at the next boundary: the step in flight finishes, and nothing queued
// behind it runs first.
//
// The queue coalesces as commands arrive, so it stays small however fast they come
// (at most kMaxQueued entries):
//   - Reset, Compare, LoadModel and OpenRun start something new: queued Play, Pause, Step,
//     Stop, Reset and Compare are dropped (they were about what is being replaced);
//     LoadModel and OpenRun also replace each other.
//   - Speed, Mode, Sampler, MaxTokens, Play/Pause: the newest replaces a queued one of the
//     same kind (only the value at the next boundary matters).
//   - Step: merges into a Step at the tail; at most kMaxQueuedSteps steps wait in all, more
//     are dropped.  Stop drops queued Play, Pause and Step.
//   - Shutdown (or destruction) empties the queue at once.
// Destruction returns within one step's time plus a little: the step in flight finishes,
// nothing queued runs, the worker is joined. (The app hides its window first, so closing is
// immediate for the person using it.)
//
// Events arrive in the order the worker produced them. A Reset event precedes every trace of
// the run it starts, so a timeline that clears on Reset never mixes runs. A Reset that fails
// (bad prompt) leaves the current run exactly as it was and says so with an Error event of
// origin Reset carrying the current run id: the timeline keeps the run, the UI shows the
// error, and Play still works on that run.
//
// History spool: every run of the live engine is appended, step by step, to a run file in an
// unlinked temporary file (run_file.h). The Reset event hands it to the timeline, each Step
// event says where its step lies in it, and File > Save copies it.
//
// Queued steps: while Step events wait for the UI, only the newest one keeps its attention
// rows (n_layer x n_head x n_attn floats, 4.5 MB at 4,096 positions for the default model);
// an older one still waiting loses them when the next step is queued. The timeline keeps
// only the newest step's rows anyway and reads older steps back from the spool, so a UI
// that draws a frame every half second while the engine makes 20 steps holds one step's
// rows in the queue, not 20 (the resident peak of a 4,096-step run in the app).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "app/core/compare_run.h"
#include "app/core/engine_setup.h"
#include "app/core/run_file.h"
#include "app/core/step_source.h"
#include "engine/session.h"

namespace kvscope::app {

// Tokens per second when playing; kSpeedMax = as fast as the engine goes.
inline constexpr float kSpeedMin = 0.25f, kSpeedTop = 30.0f, kSpeedMax = 0.0f;
inline constexpr int kMaxQueuedSteps = 16;
inline constexpr size_t kMaxQueued = 32;

struct CmdReset {
  PromptSpec prompt;
  bool autoplay = false;
};
struct CmdPlay {};
struct CmdPause {};
struct CmdStep {
  int count = 1;  // queued single steps merged into one entry
};
struct CmdSpeed {
  float tokens_per_s = 4.0f;
};  // kSpeedMax or [kSpeedMin, kSpeedTop]
struct CmdMode {
  CacheMode mode = CacheMode::Cache;
};
struct CmdSampler {
  SamplerConfig sampler;
};
struct CmdMaxTokens {
  int max_tokens = 256;
};
// Measure (or stop measuring) the quantization error of the K/V rows each step writes.
struct CmdKvErrors {
  bool on = false;
};
struct CmdStop {};  // pause and mark the run finished (reason Stopped)
struct CmdShutdown {};
// The same prompt twice, as fast as the engine goes: `steps` steps with the KV cache, then
// `steps` without it. The mode and token limit in force before are restored afterwards.
// Interleaved: both runs at once, one KV CACHE step, then one NO CACHE step, and so on, so
// both see the same machine load. The NO CACHE run is a second session on the same model
// (StepSource::twin); the run the timeline shows is the KV CACHE one, and each NO CACHE step
// arrives as a CompareStep event. Either way the two runs must sample the same tokens (the
// engine's invariant): a difference ends the comparison with an Error naming the step.
struct CmdCompare {
  PromptSpec prompt;
  int steps = 64;
  bool interleaved = false;
};
// Replaces the engine with a newly opened model (on failure the current one stays).
struct CmdLoadModel {
  EngineOptions options;
};
// Replaces the engine with a recording to play back (on failure the current one stays).
struct CmdOpenRun {
  std::string path;
};
// Writes run `run` (it must still be the current one) to a run file at `path`.
struct CmdSave {
  std::string path;
  uint64_t run = 0;
};
using Command =
    std::variant<CmdReset, CmdPlay, CmdPause, CmdStep, CmdSpeed, CmdMode, CmdSampler, CmdMaxTokens,
                 CmdKvErrors, CmdStop, CmdShutdown, CmdCompare, CmdLoadModel, CmdOpenRun, CmdSave>;

struct Event {
  // CompareStep: a step of the NO CACHE run of an interleaved comparison (attention rows and
  // K/V norms left out); its run is the KV CACHE run it goes with.
  enum class Kind { Reset, Step, Error, Finished, ModeChanged, Source, Saved, Notice, CompareStep };
  Event() = default;
  Event(Kind k, uint64_t r) : kind(k), run(r) {}
  Kind kind = Kind::Step;
  uint64_t run = 0;                             // run id: increments on every successful Reset
  std::shared_ptr<const StepTrace> trace;       // Step
  std::string prompt_text;                      // Reset
  bool prompt_chat = false;                     // Reset: the prompt uses the chat template
  CacheMode mode = CacheMode::Cache;            // ModeChanged / Reset / Error
  std::string error;                            // Error; Notice: the text
  ErrorOrigin origin = ErrorOrigin::Step;       // Error
  FinishReason reason = FinishReason::Running;  // Finished: eos, max_tokens, ..., stopped, error
  std::shared_ptr<RunFile> store;               // Reset: where this run's steps are kept (or null)
  uint64_t offset = kNoOffset;                  // Step: its record in `store`
  double done_s = 0;                            // Step: steady-clock seconds when it finished
  ComparePhase compare = ComparePhase::None;    // Reset: the comparison this run is part of
  std::shared_ptr<const ModelFacts> facts;      // Source
  bool replay = false;                          // Source: a recording, not the model
  std::string path;                             // Saved / Source (a replay's file)
  uint64_t bytes = 0;                           // Saved
};

// A lock-free snapshot for the UI (what the worker is doing right now).
struct ControllerState {
  bool playing = false;
  bool busy = false;        // a step is running
  bool loading = false;     // a model or a recording is being opened
  int computing_step = 0;   // while busy: the 1-based step being computed
  double busy_seconds = 0;  // while busy: how long that step has been running
  bool finished = false;    // the run stopped (eos, max tokens, stop, error) or none began
  bool has_source = false;  // a model or a recording is loaded
  bool replay = false;      // the source is a recording
  ComparePhase compare = ComparePhase::None;  // the comparison running (if any)
  float speed = 4.0f;
  int steps = 0;
  // What Save would write now: the bytes of this run's history file (the spool, or the
  // recording being played), 0 when there is nothing to save.
  uint64_t save_bytes = 0;
};

struct ControllerOptions {
  bool spool = true;                // keep each live run in a history spool
  std::string spool_dir;            // "" = default_spool_dir()
  uint64_t spool_cap = 4ull << 30;  // beyond this size, steps are kept without attention
  AttnEncoding spool_attention = AttnEncoding::F16;
};
// $KVSCOPE_SPOOL_DIR, else $XDG_CACHE_HOME/kvscope, else ~/.cache/kvscope, else /var/tmp.
std::string default_spool_dir();

class Controller : private CompareHost {
 public:
  // `source` may be null: the UI then offers to load a model or a recording.
  explicit Controller(std::unique_ptr<StepSource> source, ControllerOptions options = {});
  explicit Controller(std::unique_ptr<Session> session, ControllerOptions options = {});
  ~Controller() override;
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  void send(Command c);
  std::vector<Event> poll();  // never blocks on the engine
  bool has_events() const;    // poll() would return something (takes nothing)
  // Blocks until an event is available or `timeout_ms` passes (for tests and headless).
  std::vector<Event> wait_events(int timeout_ms);
  ControllerState state() const;
  size_t queued() const;  // commands waiting (<= kMaxQueued)

 private:
  void run();
  void handle(Command& c);
  void handle_settings(Command& c);
  bool start_run(const PromptSpec& prompt, bool autoplay, ComparePhase compare);
  void do_step();
  void do_twin_step();
  void finish_run(FinishReason reason);
  void set_mode(CacheMode m, ErrorOrigin origin);
  // CompareHost: compare modes (compare_run.h) run on this worker.
  StepSource* compare_source() override { return source_.get(); }
  bool compare_start(const PromptSpec& prompt, ComparePhase phase) override;
  void compare_set_mode(CacheMode mode) override { set_mode(mode, ErrorOrigin::Mode); }
  void compare_error(ErrorOrigin origin, std::string message) override;
  void compare_finish(FinishReason reason) override { finish_run(reason); }
  void compare_twin_step(StepTrace trace) override;
  void replace_source(std::unique_ptr<StepSource> s);
  void save(const CmdSave& s);
  void emit(Event e);
  // Queues a Step event whose trace is `full` (only this controller holds it yet); the
  // previous step still in the queue loses its attention rows (see "Queued steps").
  void emit_step(Event e, std::shared_ptr<StepTrace> full);
  void emit_error(ErrorOrigin origin, std::string message);
  void emit_source();
  void publish();
  bool can_step() const;

  std::unique_ptr<StepSource> source_;  // touched only by the worker thread
  ControllerOptions opts_;
  std::thread worker_;

  mutable std::mutex cmd_mu_;
  std::condition_variable cmd_cv_;
  std::deque<Command> commands_;
  std::atomic<bool> quit_{false};

  mutable std::mutex ev_mu_;
  std::condition_variable ev_cv_;
  std::deque<Event> events_;
  // The newest Step trace queued with its attention rows (writable: this controller made
  // it); its rows go when a newer step is queued while it still waits. Guarded by ev_mu_.
  std::shared_ptr<StepTrace> queued_full_;

  // Worker-side state (mirrored into the atomics for the UI).
  bool playing_ = false, finished_ = true, has_run_ = false;
  int manual_steps_ = 0;  // Step commands not yet run
  int steps_ = 0;
  float speed_ = 4.0f;
  uint64_t run_ = 0;
  FinishReason end_reason_ = FinishReason::Running;
  std::shared_ptr<RunFile> spool_;  // this run's history (live source)
  CompareRun compare_{*this};
  std::atomic<bool> a_playing_{false}, a_busy_{false}, a_loading_{false}, a_finished_{true},
      a_has_source_{false}, a_replay_{false};
  std::atomic<ComparePhase> a_compare_{ComparePhase::None};
  std::atomic<float> a_speed_{4.0f};
  std::atomic<int> a_steps_{0};
  std::atomic<uint64_t> a_save_bytes_{0};
  std::atomic<int64_t> a_busy_since_ns_{0};  // steady_clock time the running step began
};

}  // namespace kvscope::app
