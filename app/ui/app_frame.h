// app_frame.h — one frame of the app's UI around the 3D view: the layout's regions filled
// with their panels (toolbar, docked side columns with collapsible sections, the
// overview strip), the notices in a corner of the view, the tooltip and the error modal.
//
// Shared by the window loop and the headless capture, so a screenshot is the app as a
// user sees it. Call between ImGui::NewFrame() and ImGui::Render(); `ctl` may be null
// (a capture with no live engine: buttons then do nothing).
#pragma once

#include "app/ui/ui_state.h"

namespace kvscope::app {

// The part of the sequence the 3D view shows (for the overview's bracket), -1 when unknown.
struct ShownRange {
  int first = -1, last = -1;
};

// Computes ui.layout for the current display size and draws every panel into it.
void draw_frame_ui(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl,
                   ShownRange shown);

// The UI scale: 1 on ordinary screens, the content scale on HiDPI ones.
float ui_scale();
// Fonts (DejaVu Sans with the ranges token labels need) and style, for a content scale.
// Call once after ImGui::CreateContext().
void setup_imgui_style(float content_scale);

}  // namespace kvscope::app
