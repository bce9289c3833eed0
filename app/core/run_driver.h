// run_driver.h — a whole run on the calling thread, without the controller's worker: for the
// `record` subcommand, the headless capture and tests.
//
// It produces the events the controller would (Reset, then one Step per step, then
// Finished) so a timeline fed here is the same as one fed by the app; with `record` every
// step is also appended to a run file, and the Step events point into it.
#pragma once

#include <functional>
#include <memory>

#include "app/core/run_file.h"
#include "app/core/step_source.h"
#include "app/core/timeline.h"

namespace kvscope::app {

struct DriveOptions {
  int steps = 0;                                  // at most this many (fewer if the run stops)
  std::shared_ptr<RunFile> record;                // optional: append every step, finish with END
  Timeline* timeline = nullptr;                   // optional: receives the events
  std::function<void(const StepTrace&)> on_step;  // optional: after each step
};

// Resets `src` with `prompt` (a replay ignores it) and steps it. Returns the END written (or
// that would be written): the number of steps and why the run ended ("running" when it
// only reached opts.steps and could go on).
Expected<RunEnd> drive_run(StepSource& src, const PromptSpec& prompt, const DriveOptions& opts);

// Compare modes, interleaved, as the controller runs it: `cache` (put in KV CACHE mode) and
// its twin in NO CACHE mode reset with `prompt`, then one KV CACHE step and one NO CACHE step
// in turn. The timeline gets the KV CACHE run's events and each NO CACHE step as a
// CompareStep; `record` (if any) keeps the KV CACHE run. An error if the two runs sample
// different tokens or stop apart.
Expected<RunEnd> drive_interleaved(StepSource& cache, const PromptSpec& prompt,
                                   const DriveOptions& opts);

}  // namespace kvscope::app
