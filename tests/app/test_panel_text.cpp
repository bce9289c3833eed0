// test_panel_text.cpp — the panels' shared text helpers (app/panel_text.h) on a headless
// ImGui context (no window, no renderer): a read-out's tooltip shows, formatted, only while
// the mouse is over that line.
#include <gtest/gtest.h>
#include <imgui.h>
#include <imgui_internal.h>

#include <cstdio>

#include "app/ui/panel_text.h"
#include "imgui_test_context.h"

using namespace kvscope::app;

namespace {

class PanelText : public ::testing::Test {
 protected:
  kvscope::test::HeadlessImGui imgui_{800, 600};

  // One frame: a panel with two lines, the first explained by a tooltip; the mouse at
  // `mouse`. Returns the tooltip window when it was shown this frame, else nullptr.
  ImGuiWindow* frame(ImVec2 mouse) {
    ImGui::GetIO().MousePos = mouse;
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(400, 300));
    ImGui::Begin("Stats");
    ImGui::Text("decode    %.1f tok/s engine", 12.5);
    line_min = ImGui::GetItemRectMin();
    line_max = ImGui::GetItemRectMax();
    hover_tooltip("Over the last %d steps after the first", 7);
    ImGui::Text("state     paused");
    other_min = ImGui::GetItemRectMin();
    ImGui::End();
    ImGuiWindow* tip = ImGui::FindWindowByName("##Tooltip_00");
    const bool shown = tip && tip->Active;
    ImGui::Render();
    return shown ? tip : nullptr;
  }

  ImVec2 line_min, line_max, other_min;
};

TEST_F(PanelText, TooltipShowsOnlyWhileItsLineIsHovered) {
  frame(ImVec2(-100, -100));  // lays the panel out
  const ImVec2 on_line((line_min.x + line_max.x) / 2, (line_min.y + line_max.y) / 2);
  const ImVec2 on_other(other_min.x + 5, other_min.y + 3);
  EXPECT_EQ(frame(ImVec2(-100, -100)), nullptr) << "no tooltip with the mouse outside";
  EXPECT_EQ(frame(on_other), nullptr) << "no tooltip over another line";
  ASSERT_NE(frame(on_line), nullptr) << "the tooltip shows over its line";
  // The tooltip holds the formatted text: its content is as wide as that text (the
  // window's size follows its content a frame later).
  ImGuiWindow* tip = frame(on_line);
  ASSERT_NE(tip, nullptr);
  const float want = ImGui::CalcTextSize("Over the last 7 steps after the first").x;
  EXPECT_NEAR(tip->ContentSize.x, want, 0.5f);
  EXPECT_LT(want, ImGui::CalcTextSize("Over the last %d steps after the first").x);
  EXPECT_EQ(frame(ImVec2(-100, -100)), nullptr) << "and goes when the mouse leaves";
}

}  // namespace
