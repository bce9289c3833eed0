// replay_source.h — a recorded run (a run file) as a StepSource, played without the model.
//
// step() hands back the recording's next step exactly as it was recorded (attention,
// candidates, timings and all); reset() rewinds to step 1 whatever prompt it is given (the
// recording has its own). Changing the mode, the sampler or the token limit is refused: the
// recording already decided them.
#pragma once

#include <memory>
#include <string>

#include "app/core/run_file.h"
#include "app/core/step_source.h"

namespace kvscope::app {

// Opens and validates `path` (one clear error for a bad, truncated or unsupported file).
Expected<std::unique_ptr<StepSource>> open_replay(const std::string& path);
std::unique_ptr<StepSource> make_replay_source(std::shared_ptr<RunFile> file);

}  // namespace kvscope::app
