// serving_capture.h — the Serving view rendered offscreen, panels and all, as a user sees
// it: `kvscope --view serving --screenshot OUT.png`, and the tests that check the capture
// against the engine's own numbers.
#pragma once

#include "app/scene/capture.h"
#include "app/ui/app_capture.h"
#include "app/ui/serving_ui.h"

namespace kvscope::app {

// Renders the Serving view of `s` (its snapshot) into an offscreen image. Needs a current
// OpenGL 3.3 context; makes (and destroys) its own ImGui context.
Expected<AppShotResult> capture_serving(render::Renderer& r, UiState& ui, ServingUi& s,
                                        const AppShot& shot);

// `kvscope --view serving --screenshot OUT [--steps N] [...]`: serves the workload on the
// model for N steps (or until every request ended), captures, writes the PNG and one line
// of what the pool held. Returns the process exit code, one line on error.
int run_serving_screenshot(const CaptureOptions& opts, const ServingSettings& settings,
                           bool panels);

}  // namespace kvscope::app
