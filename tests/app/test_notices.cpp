// test_notices.cpp — the notices over the 3D view (the "No usable GPU" one, a file saved) on
// a headless ImGui context drawing the whole frame UI: a notice shows, fades by itself after
// kNoticeSeconds instead of covering the view until closed, and stays readable in the Run
// section's Messages list.
#include <gtest/gtest.h>
#include <imgui.h>
#include <imgui_internal.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "app/core/timeline.h"
#include "app/ui/app_frame.h"
#include "app/ui/ui_state.h"
#include "imgui_test_context.h"

using namespace kvscope::app;

namespace {

constexpr float kFrameSeconds = 0.25f;

// The notice's window when it was drawn this frame, else nullptr.
ImGuiWindow* notice_window(const Notice& n) {
  char id[32];
  std::snprintf(id, sizeof id, "##notice%llu", static_cast<unsigned long long>(n.id));
  ImGuiWindow* w = ImGui::FindWindowByName(id);
  return w && w->Active ? w : nullptr;
}

}  // namespace

TEST(Notices, ANoticeFadesByItselfAndStaysInTheMessagesList) {
  kvscope::test::HeadlessImGui imgui(1280, 720, kFrameSeconds);
  UiState ui;
  Timeline tl;
  const std::string text = "No usable GPU (no CUDA-capable device); running on the CPU backend.";
  add_notice(ui, text);
  ASSERT_EQ(ui.notices.size(), 1u);
  const Notice notice = ui.notices[0];
  int shown = 0;
  int first_alpha = -1, least_alpha = 256;  // of the notice's background, 0..255
  const int frames = int((kNoticeSeconds + 2.0) / kFrameSeconds);
  for (int f = 0; f < frames; ++f) {
    ImGui::NewFrame();
    draw_frame_ui(ui, nullptr, ControllerState{}, tl, ShownRange{});
    ImGui::Render();
    ImGuiWindow* w = ui.notices.empty() ? nullptr : notice_window(notice);
    if (!w || w->DrawList->VtxBuffer.empty()) continue;
    ++shown;
    const int alpha = int(w->DrawList->VtxBuffer[0].col >> IM_COL32_A_SHIFT) & 0xFF;
    if (first_alpha < 0) first_alpha = alpha;
    least_alpha = std::min(least_alpha, alpha);
  }
  EXPECT_TRUE(ui.notices.empty()) << "the notice still covers the view after "
                                  << frames * kFrameSeconds << " s";
  EXPECT_GE(shown * kFrameSeconds, kNoticeSeconds - 2 * kFrameSeconds) << "it was shown first";
  EXPECT_LE(shown * kFrameSeconds, kNoticeSeconds + 2 * kFrameSeconds);
  EXPECT_GT(first_alpha, 200) << "it shows plainly at first";
  EXPECT_LT(least_alpha, first_alpha / 2) << "it fades out rather than vanishing at once";
  ASSERT_EQ(ui.notice_log.size(), 1u);
  EXPECT_NE(ui.notice_log.back().find(text), std::string::npos) << ui.notice_log.back();
}
