// measure_controller_latency.cpp — Stop and close latency with the real model, the case
// that used to wait behind queued work: NO CACHE at ~1,000 tokens with 10 Steps queued.
// Not a ctest (a NO CACHE step at 1,000 tokens takes seconds); run by hand:
//
//   build/tests/app/measure_controller_latency [--tokens 1000] [--queued 10] [--threads 0]
//
// It opens the default model on the CPU in NO CACHE mode with a prompt of about --tokens
// tokens (the GPL-3 text), runs the prefill, then twice queues --queued Steps behind a step in
// flight: once followed by Stop (time from Stop to the Finished event, and how many steps ran
// after Stop was sent), once followed by destroying the controller (what closing the window
// does: time until the destructor returns). Both should take at most the rest of the step in
// flight, never the queued steps (before the step-boundary controller they took the whole
// queue: 10 steps).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "app/core/controller.h"
#include "app/core/engine_setup.h"

using namespace kvscope;
using namespace kvscope::app;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Waits until `pred(events)` or `seconds`; returns the events seen.
template <class Pred>
bool wait_for(Controller& c, std::vector<Event>& all, Pred pred, double seconds) {
  auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (!pred(all)) {
    if (Clock::now() > until) return false;
    for (Event& e : c.wait_events(10)) all.push_back(std::move(e));
  }
  return true;
}

int count(const std::vector<Event>& ev, Event::Kind k) {
  int n = 0;
  for (const Event& e : ev) n += e.kind == k;
  return n;
}

bool wait_busy(Controller& c, double seconds) {
  auto until = Clock::now() + std::chrono::duration<double>(seconds);
  while (!c.state().busy && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return c.state().busy;
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 1000, queued = 10, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--queued")) queued = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  eo.threads = threads;
  eo.mode = CacheMode::NoCache;
  eo.max_tokens = 1000;
  auto eng = open_engine(eo);
  if (!eng.ok()) {
    std::fprintf(stderr, "measure: %s\n", eng.error().message.c_str());
    return 1;
  }
  // About 4.3 characters per token for this English text.
  std::ifstream f("/usr/share/common-licenses/GPL-3");
  std::stringstream ss;
  ss << f.rdbuf();
  PromptSpec prompt{ss.str().substr(0, size_t(tokens) * 43 / 10), false};

  ControllerOptions co;
  co.spool_dir = "/tmp";
  auto ctl = std::make_unique<Controller>(std::move(eng.value().session), co);
  std::vector<Event> ev;
  ctl->send(CmdMode{CacheMode::NoCache});
  ctl->send(CmdReset{prompt, false});
  ctl->send(CmdStep{});  // the prefill
  if (!wait_for(*ctl, ev, [](auto& e) { return count(e, Event::Kind::Step) >= 1; }, 600)) {
    std::fprintf(stderr, "measure: no first step (errors: %d)\n", count(ev, Event::Kind::Error));
    return 1;
  }
  int seq = 0;
  for (const Event& e : ev)
    if (e.kind == Event::Kind::Step) seq = e.trace->seq_len;
  std::printf("prompt + prefill: SEQ_LEN %d\n", seq);

  // One full step for its time.
  auto t = Clock::now();
  ctl->send(CmdStep{});
  wait_for(*ctl, ev, [](auto& e) { return count(e, Event::Kind::Step) >= 2; }, 600);
  const double step_s = since(t);
  std::printf("one NO CACHE step at SEQ_LEN %d: %.2f s (queued work before the fix: %d steps "
              "= ~%.0f s)\n",
              seq + 1, step_s, queued, queued * step_s);

  // Stop behind queued Steps.
  const int steps_before = count(ev, Event::Kind::Step);
  for (int i = 0; i < queued; ++i) ctl->send(CmdStep{});
  wait_busy(*ctl, 10);
  auto t_in_flight = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the step is well under way
  auto t_stop = Clock::now();
  ctl->send(CmdStop{});
  wait_for(*ctl, ev, [](auto& e) { return count(e, Event::Kind::Finished) >= 1; }, 600);
  const double stop_s = since(t_stop);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (Event& e : ctl->poll()) ev.push_back(std::move(e));
  std::printf("Stop with %d Steps queued: took effect after %.2f s (step in flight began %.2f s "
              "before Stop); steps run after Stop: %d (the one in flight)\n",
              queued, stop_s, std::chrono::duration<double>(t_stop - t_in_flight).count(),
              count(ev, Event::Kind::Step) - steps_before);

  // Close (destroy the controller) behind queued Steps.
  ctl->send(CmdPlay{});  // a stopped run does not step; play resumes nothing, Step does
  ctl->send(CmdReset{prompt, false});
  ctl->send(CmdStep{});
  ev.clear();
  wait_for(*ctl, ev, [](auto& e) { return count(e, Event::Kind::Step) >= 1; }, 600);
  for (int i = 0; i < queued; ++i) ctl->send(CmdStep{});
  wait_busy(*ctl, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto t_close = Clock::now();
  ctl.reset();
  std::printf("close with %d Steps queued: the controller was gone after %.2f s\n", queued,
              since(t_close));
  return 0;
}
