// finish_reason.h — why a run ended, as the controller, compare modes, the timeline and run
// files see it. Strings only at the edges: the UI's text and the run file's END record, both
// through to_string / finish_reason_from_string (the strings run files have always held).
#pragma once

#include <optional>
#include <string_view>

#include "engine/session.h"

namespace kvscope::app {

enum class FinishReason {
  Running,      // "running": not ended (a run saved mid-way, or still going)
  Eos,          // "eos": the model's end-of-sequence token (the engine's reasons ...)
  MaxTokens,    // "max_tokens"
  StopString,   // "stop_string"
  ContextFull,  // "context_full"
  StopToken,    // "stop_token": one of the run's stop token ids
  Stopped,      // "stopped": the person pressed Stop
  Error,        // "error": a step failed, or compare modes found the two runs apart
};

const char* to_string(FinishReason r);
// The reason a string names (exactly what to_string writes), or nothing.
std::optional<FinishReason> finish_reason_from_string(std::string_view s);
// The engine's stop reason (None, still going: Running).
FinishReason finish_reason_of(StopReason r);
// Ended by itself (the engine or the recording stopped it), not by Stop or an error.
inline bool ended_by_itself(FinishReason r) {
  return r != FinishReason::Stopped && r != FinishReason::Error;
}

}  // namespace kvscope::app
