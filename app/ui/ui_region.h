// ui_region.h — a layout region (app/scene/window_layout.h) as a fixed, undecorated ImGui
// window: pinned to its rectangle every frame, no title bar, no move, no resize, no saved
// settings, never raised over the others. The single view and the Serving view both lay
// their panels out this way.
#pragma once

#include <imgui.h>

#include "app/scene/window_layout.h"

namespace kvscope::app {

inline constexpr ImGuiWindowFlags kRegionFlags =
    ImGuiWindowFlags_NoTitleBar | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoMove |
    ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings |
    ImGuiWindowFlags_NoBringToFrontOnFocus;

// Begins the window `id` over `r` with kRegionFlags | extra; the caller ends it
// (ImGui::End) whatever this returns, as with ImGui::Begin.
inline bool begin_region(const char* id, const UiRect& r, ImGuiWindowFlags extra = 0) {
  ImGui::SetNextWindowPos(ImVec2(r.x, r.y), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImVec2(r.w, r.h), ImGuiCond_Always);
  return ImGui::Begin(id, nullptr, kRegionFlags | extra);
}

}  // namespace kvscope::app
