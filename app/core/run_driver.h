// run_driver.h — a whole run on the calling thread, without the controller's worker: for the
// `record` subcommand, the headless capture and tests.
//
// It produces the events the controller would (Reset, then one Step per step, then
// Finished) so a timeline fed here is the same as one fed by the app; with `record` every
// step is also appended to a run file, and the Step events point into it. Compare modes run
// through the same CompareRun (compare_run.h) as the app's, this thread its host.
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
  // Compare modes one after the other: where the NO CACHE run is kept (optional; `record`
  // keeps the KV CACHE run).
  std::function<std::shared_ptr<RunFile>()> next_record;
  // Compare modes: called with every event, as a controller would queue it (optional).
  std::function<void(const Event&)> on_event;
};

// Resets `src` with `prompt` (a replay ignores it) and steps it. Returns the END written (or
// that would be written): the number of steps and why the run ended ("running" when it
// only reached opts.steps and could go on).
Expected<RunEnd> drive_run(StepSource& src, const PromptSpec& prompt, const DriveOptions& opts);

// Compare modes as the app runs them (CmdCompare in controller.h), opts.steps steps of each
// run: `src` with the KV CACHE, then without (interleaved: a twin in NO CACHE mode stepped
// after each KV CACHE step, its steps CompareStep events). The person's mode and token limit
// come back afterwards. Returns the last run's END; an error if the two runs sample
// different tokens or stop apart.
Expected<RunEnd> drive_compare(StepSource& src, const PromptSpec& prompt, bool interleaved,
                               const DriveOptions& opts);

}  // namespace kvscope::app
