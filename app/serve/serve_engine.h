// serve_engine.h — the one thread that owns the Scheduler while `kvscope serve` runs.
//
// HTTP handler threads never call the engine. They hand an ApiRequest over with submit()
// (a mutex-guarded inbox) and get back a Channel: a per-request queue of ServeEvents that
// the engine thread fills (Accepted or Error first, then Text and Finish per choice, then
// Done). The engine thread tokenizes (the chat template for chat requests), checks the
// prompt against the context, adds the request to the Scheduler (n samples fork off its
// prompt), steps the Scheduler while anything runs, and routes each sampled token's text
// to its channel. Stop strings are matched there too, on the detokenized text: text that
// could be the start of a stop string is held back until it cannot; a match ends the
// sequence (Scheduler::cancel) and the text before it is the choice's last.
// A handler whose client went away calls Channel::cancel(); the engine thread sees it
// before its next step, cancels the request's sequences (their blocks go back to the pool)
// and forgets them. shutdown() ends every request in flight with a 503 and joins the thread.
// /health reads snapshot(): pool counts and queue sizes the engine thread publishes after
// every step, with the pool's invariant check (Scheduler::check) whenever it falls idle.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/serve/serve_api.h"
#include "engine/scheduler.h"

namespace kvscope::serve {

struct ServeEvent {
  enum class Kind { Accepted, Error, Text, Finish, Done };
  Kind kind = Kind::Text;
  int index = 0;                       // Text, Finish: the choice
  std::string text;                    // Text: new text of the choice
  std::vector<TokenLogprob> logprobs;  // Text: its tokens' log-probabilities (when asked)
  std::string finish_reason;           // Finish: "stop" | "length"
  ApiUsage usage;                      // Accepted: prompt tokens; Done: both counts
  ApiError error;                      // Error
};

// One request's events, from the engine thread to its handler thread.
class Channel {
 public:
  void push(ServeEvent e);
  // Moves every queued event into `out`; waits up to `timeout` when none is queued.
  // Returns whether any was moved.
  bool pop(std::vector<ServeEvent>& out, std::chrono::milliseconds timeout);
  // The client went away: the engine cancels the request's sequences.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ServeEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct EngineSnapshot {
  KvPoolCounts pool;
  int block_size = 0;
  int running = 0, waiting = 0;
  int in_flight = 0;  // requests handed over and not done (the queue limit counts these)
  uint64_t steps = 0;
  uint64_t requests = 0;          // accepted since start
  uint64_t cancelled = 0;         // cancelled by their client since start
  std::string pool_check = "ok";  // Scheduler::check at the last idle moment
};

// Watches the scheduler from the engine thread (the app's Serving view draws what the
// server's clients do to the pool). Called on the engine thread: keep it short.
class ServeObserver {
 public:
  virtual ~ServeObserver() = default;
  // A request was added: its first sequence id and the request (prompt ids, n, ...).
  virtual void added(int first_seq, const Request& r) = 0;
  // A step ran; called before its tokens are routed (and ended sequences forgotten).
  virtual void stepped(const BatchStep& st, const Scheduler& s) = 0;
  // Sequences ended between steps (a client went away, a stop string matched): their blocks
  // went back to the pool where no step reports it; `events` holds a Cancel for each, or a
  // Finish with detail "stop_string" (the scheduler itself calls it cancelled).
  virtual void changed(const std::vector<SchedEvent>& events, const Scheduler& s) {
    (void)events;
    (void)s;
  }
};

struct ServeEngineConfig {
  int max_queue = 64;  // requests in flight at once (running or waiting); more: 503
  std::shared_ptr<ServeObserver> observer;  // optional
};

class ServeEngine {
 public:
  // The scheduler (with its model and backend, which outlive the engine) is the engine
  // thread's alone from start() on.
  ServeEngine(std::unique_ptr<Scheduler> sched, ServeEngineConfig cfg);
  ~ServeEngine();
  void start();
  // From any thread: hands a request over. Null, with *err set (503), when the queue is
  // full or the server is shutting down.
  std::shared_ptr<Channel> submit(ApiRequest req, ApiError* err);
  // New requests get 503 from now on; those in flight run on.
  void stop_accepting();
  // Ends every request in flight with a 503 error event, refuses new ones and joins the
  // engine thread. Idempotent.
  void shutdown();
  EngineSnapshot snapshot() const;

 private:
  struct Job;
  void loop();
  void admit(Job& job);
  void route(const BatchStep& st);
  void emit(Job& job, int index, bool final);
  void finish_choice(Job& job, int index, const std::string& reason);
  void end_job(Job& job);
  // Cancels a live sequence outside a step and notes it for the observer (as `kind`).
  void cancel_seq(int seq, EventKind kind = EventKind::Cancel, const char* detail = "");
  void tell_observer();
  void fail_all(const ApiError& e);
  void publish(bool idle);

  std::unique_ptr<Scheduler> sched_;
  ServeEngineConfig cfg_;
  std::thread thread_;
  mutable std::mutex mu_;  // inbox_, stopping_, snap_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> inbox_;
  bool stopping_ = false;  // the engine thread ends
  bool accepting_ = true;
  EngineSnapshot snap_;
  std::atomic<int> in_flight_{0};
  // Engine thread only:
  std::vector<std::unique_ptr<Job>> jobs_;
  std::vector<Job*> by_seq_;  // sequence id -> its job (null once forgotten)
  std::vector<SchedEvent> between_;  // sequences cancelled since the observer last heard
  uint64_t requests_ = 0, cancelled_ = 0;
};

// The longest suffix of `text` that is a proper prefix of one of `stops` (the bytes a
// stream holds back), and the first position at or after `from` where one of them occurs
// (npos if none; the earliest match, then the longest stop).
size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops);
size_t stop_find(const std::string& text, size_t from, const std::vector<std::string>& stops);

}  // namespace kvscope::serve
