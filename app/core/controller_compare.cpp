// controller_compare.cpp — the controller's worker as the host of compare modes
// (compare_run.h): the comparison's runs are this worker's runs, its NO CACHE steps of an
// interleaved comparison arrive as CompareStep events (see CmdCompare in controller.h).
#include <string>

#include "app/core/clock.h"
#include "app/core/controller.h"

namespace kvscope::app {

bool Controller::compare_start(const PromptSpec& prompt, ComparePhase phase) {
  return start_run(prompt, true, phase);
}

void Controller::compare_error(ErrorOrigin origin, std::string message) {
  emit_error(origin, std::move(message));
}

void Controller::compare_twin_step(StepTrace trace) {
  Event e{Event::Kind::CompareStep, run_};
  e.done_s = now_s();
  e.trace = std::make_shared<const StepTrace>(std::move(trace));
  emit(std::move(e));
}

void Controller::do_twin_step() {
  a_busy_since_ns_ = now_ns();
  a_busy_ = true;
  compare_.step_twin();
  a_busy_ = false;
}

}  // namespace kvscope::app
