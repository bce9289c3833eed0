// imgui_test_context.h — a headless Dear ImGui context for panel and input tests: no
// window and no renderer, the default font built, no .ini file. Frames are driven by the
// test (NewFrame ... EndFrame); nothing is drawn.
#pragma once

#include <imgui.h>

namespace kvscope::test {

class HeadlessImGui {
 public:
  HeadlessImGui(float width, float height, float delta_time = 1.0f / 60.0f) {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(width, height);
    io.DeltaTime = delta_time;
    unsigned char* px = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&px, &w, &h);  // builds the default font
  }
  ~HeadlessImGui() { ImGui::DestroyContext(); }
  HeadlessImGui(const HeadlessImGui&) = delete;
  HeadlessImGui& operator=(const HeadlessImGui&) = delete;
};

}  // namespace kvscope::test
