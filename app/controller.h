// controller.h — owns the engine Session on a worker thread.
//
// The UI thread never touches the Session: it send()s commands (processed in order)
// and drains events with poll() once per frame. Events arrive in the order the worker
// produced them: a Reset event precedes every trace of the run it starts, so a
// timeline that clears on Reset never mixes runs. A step in flight is never
// interrupted; commands sent meanwhile run right after it. Destruction (or Shutdown)
// finishes the step in flight and joins the worker.
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

#include "engine/session.h"

namespace kvscope::app {

// Tokens per second when playing; kSpeedMax = as fast as the engine goes.
inline constexpr float kSpeedMin = 0.25f, kSpeedTop = 30.0f, kSpeedMax = 0.0f;

struct CmdReset {
  PromptSpec prompt;
  bool autoplay = false;
};
struct CmdPlay {};
struct CmdPause {};
struct CmdStep {};
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
struct CmdStop {};  // pause and mark the run finished (no more steps until a reset)
struct CmdShutdown {};
using Command = std::variant<CmdReset, CmdPlay, CmdPause, CmdStep, CmdSpeed, CmdMode, CmdSampler,
                             CmdMaxTokens, CmdStop, CmdShutdown>;

struct Event {
  enum class Kind { Reset, Step, Error, Finished, ModeChanged };
  Event() = default;
  Event(Kind k, uint64_t r) : kind(k), run(r) {}
  Kind kind = Kind::Step;
  uint64_t run = 0;                        // run id: increments on every Reset
  std::shared_ptr<const StepTrace> trace;  // Kind::Step
  std::string prompt_text;                 // Kind::Reset
  bool prompt_chat = false;                // Kind::Reset: the prompt uses the chat template
  CacheMode mode = CacheMode::Cache;       // Kind::ModeChanged / Reset
  std::string error;                       // Kind::Error
};

// A lock-free snapshot for the UI (what the worker is doing right now).
struct ControllerState {
  bool playing = false;
  bool busy = false;      // a step is running
  int computing_step = 0;     // while busy: the 1-based step being computed
  double busy_seconds = 0;    // while busy: how long that step has been running
  bool finished = false;  // the run stopped (eos, max tokens, stop, error)
  float speed = 4.0f;
  int steps = 0;
};

class Controller {
 public:
  explicit Controller(std::unique_ptr<Session> session);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  void send(Command c);
  std::vector<Event> poll();  // never blocks on the engine
  // Blocks until an event is available or `timeout_ms` passes (for tests and headless).
  std::vector<Event> wait_events(int timeout_ms);
  ControllerState state() const;

 private:
  void run();
  void handle(Command& c);
  void do_step();
  void emit(Event e);
  void emit_error(std::string message);

  std::unique_ptr<Session> session_;  // touched only by the worker thread
  std::thread worker_;

  std::mutex cmd_mu_;
  std::condition_variable cmd_cv_;
  std::deque<Command> commands_;

  std::mutex ev_mu_;
  std::condition_variable ev_cv_;
  std::deque<Event> events_;

  // Worker-side state (mirrored into the atomics for the UI).
  bool playing_ = false, finished_ = true, quit_ = false, has_prompt_ = false;
  float speed_ = 4.0f;
  uint64_t run_ = 0;
  std::atomic<bool> a_playing_{false}, a_busy_{false}, a_finished_{true};
  std::atomic<float> a_speed_{4.0f};
  std::atomic<int> a_steps_{0};
  std::atomic<int64_t> a_busy_since_ns_{0};  // steady_clock time the running step began
};

}  // namespace kvscope::app
