// test_panel_controls.cpp — the Controls panel on a headless ImGui context (no window, no
// renderer, no engine): the beams' default layer is the model's middle one even when the
// first frames are drawn while the model is still loading (its layer count unknown).
#include <gtest/gtest.h>
#include <imgui.h>

#include "app/scene/scene_builder.h"
#include "app/core/timeline.h"
#include "app/ui/ui_state.h"

#include "imgui_test_context.h"

using namespace kvscope::app;

namespace {

class PanelControls : public ::testing::Test {
 protected:
  kvscope::test::HeadlessImGui imgui_{1280, 720};

  void frame(UiState& ui) {
    ImGui::NewFrame();
    ImGui::SetNextWindowSize(ImVec2(300, 700));
    ImGui::Begin("Controls");
    panel_controls(ui, nullptr, cs, tl);
    ImGui::End();
    ImGui::Render();
  }

  ControllerState cs;
  Timeline tl;
};

TEST_F(PanelControls, FramesDrawnWhileTheModelLoadsLeaveTheMiddleLayerToTheModel) {
  UiState ui;
  ASSERT_EQ(ui.view.layer, kMiddleLayer);
  ASSERT_EQ(ui.facts.n_layer, 0);  // nothing known yet
  frame(ui);
  frame(ui);
  EXPECT_EQ(ui.view.layer, kMiddleLayer) << "a layer was picked before the model was known";
  ui.facts.n_layer = 30;  // the model's facts arrive
  frame(ui);
  EXPECT_EQ(ui.view.layer, 15);
}

}  // namespace
