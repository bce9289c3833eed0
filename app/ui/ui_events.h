// ui_events.h — the UI thread's side of the controller: starting it with what the command
// line asked for, and turning its events into timeline and UI state each frame.
//
// The model (or the recording) opens on the controller's worker, so the window is up at
// once, and a model that fails to load leaves a usable UI: the error shows in the modal and
// the person can pick another model or the built-in one.
#pragma once

#include <memory>

#include "app/scene/capture.h"
#include "app/core/controller.h"
#include "app/core/timeline.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

// A controller with no engine yet, asked to open cap.replay_path (a recording) or the
// model cap.model_path / cap.backend. When it is loaded, the first prompt is reset (and
// played if `autoplay`).
std::unique_ptr<Controller> start_controller(UiState& ui, const CaptureOptions& cap, bool autoplay);

// One controller event into `tl` and `ui`: facts of a newly loaded model or recording (then
// the selected prompt is reset), errors in the modal, notices, when the newest step
// arrived. `now` is the UI clock in seconds.
void apply_event(UiState& ui, Controller& ctl, Timeline& tl, const Event& e, double now);
// Once a frame: the history slider's request, and the app's resident memory (sampled twice
// a second for the Stats section).
void sync_frame(UiState& ui, Timeline& tl, double now);
// Both, for loops that drain the controller themselves each frame.
void apply_events(UiState& ui, Controller& ctl, Timeline& tl, double now);

}  // namespace kvscope::app
