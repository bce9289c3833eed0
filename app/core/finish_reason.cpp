// finish_reason.cpp — see finish_reason.h.
#include "app/core/finish_reason.h"

namespace kvscope::app {

namespace {
constexpr FinishReason kAll[] = {FinishReason::Running,     FinishReason::Eos,
                                 FinishReason::MaxTokens,   FinishReason::StopString,
                                 FinishReason::ContextFull, FinishReason::StopToken,
                                 FinishReason::Stopped,     FinishReason::Error};
}  // namespace

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Running:
      return "running";
    case FinishReason::Eos:
      return "eos";
    case FinishReason::MaxTokens:
      return "max_tokens";
    case FinishReason::StopString:
      return "stop_string";
    case FinishReason::ContextFull:
      return "context_full";
    case FinishReason::StopToken:
      return "stop_token";
    case FinishReason::Stopped:
      return "stopped";
    case FinishReason::Error:
      return "error";
  }
  return "running";
}

std::optional<FinishReason> finish_reason_from_string(std::string_view s) {
  for (FinishReason r : kAll)
    if (s == to_string(r)) return r;
  return std::nullopt;
}

FinishReason finish_reason_of(StopReason r) {
  switch (r) {
    case StopReason::None:
      return FinishReason::Running;
    case StopReason::Eos:
      return FinishReason::Eos;
    case StopReason::MaxTokens:
      return FinishReason::MaxTokens;
    case StopReason::StopString:
      return FinishReason::StopString;
    case StopReason::ContextFull:
      return FinishReason::ContextFull;
    case StopReason::StopToken:
      return FinishReason::StopToken;
    case StopReason::Pruned:  // beams of the scheduler's beam search, never a session's
    case StopReason::SearchDone:
      return FinishReason::Stopped;
  }
  return FinishReason::Running;
}

}  // namespace kvscope::app
