// test_input_queue.cpp — no lost input at any frame rate (app/ui/input_queue.h): the
// queue's rules for what one frame takes, then, on a headless ImGui context (no window), a
// click, a key tap and typing with Ctrl+A and Delete, all arriving between two frames,
// each reach ImGui and act; the toolbar's C key switches KV CACHE / NO CACHE.
#include <GLFW/glfw3.h>
#include <gtest/gtest.h>
#include <imgui.h>

#include <algorithm>
#include <string>
#include <vector>

#include "imgui_test_context.h"
#include "app/core/timeline.h"
#include "app/ui/input_queue.h"
#include "app/ui/ui_state.h"

using namespace kvscope::app;
using E = InputEvent;

static_assert(kKeyLeftShift == GLFW_KEY_LEFT_SHIFT && kKeyLeftControl == GLFW_KEY_LEFT_CONTROL &&
              kKeyLeftAlt == GLFW_KEY_LEFT_ALT && kKeyLeftSuper == GLFW_KEY_LEFT_SUPER &&
              kKeyRightShift == GLFW_KEY_RIGHT_SHIFT &&
              kKeyRightControl == GLFW_KEY_RIGHT_CONTROL && kKeyRightAlt == GLFW_KEY_RIGHT_ALT &&
              kKeyRightSuper == GLFW_KEY_RIGHT_SUPER);

namespace {

// A key that types a character: press, the character, release.
void type_key(InputQueue& q, int key, unsigned ch) {
  q.push(E::key(key, true));
  q.push(E::character(ch));
  q.push(E::key(key, false));
}

}  // namespace

TEST(InputQueue, AClickWithinOneFrameIsAPressThenARelease) {
  InputQueue q;
  q.push(E::pos(10, 20));
  q.push(E::button(0, true));
  q.push(E::button(0, false));
  q.push(E::pos(50, 60));
  EXPECT_TRUE(q.urgent());
  FrameInput f1 = q.take_frame(false);
  EXPECT_TRUE(f1.mouse_down[0]);
  EXPECT_TRUE(f1.button_changed);
  EXPECT_EQ(f1.x, 10.0f);
  EXPECT_EQ(f1.y, 20.0f);
  EXPECT_TRUE(f1.more);
  EXPECT_EQ(f1.taken, 2);
  EXPECT_TRUE(q.urgent()) << "the release waits: the next frame is drawn at once";
  FrameInput f2 = q.take_frame(false);
  EXPECT_FALSE(f2.mouse_down[0]);
  EXPECT_EQ(f2.x, 10.0f) << "the release lands where it was made; the move comes after";
  EXPECT_TRUE(f2.more);
  FrameInput f3 = q.take_frame(false);
  EXPECT_FALSE(f3.mouse_down[0]);
  EXPECT_FALSE(f3.button_changed);
  EXPECT_EQ(f3.x, 50.0f);
  EXPECT_FALSE(f3.more);
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(q.urgent());
}

TEST(InputQueue, MovesBatchAndOnlyMovesAreNotUrgent) {
  InputQueue q;
  for (int i = 0; i < 10; ++i) q.push(E::pos(float(i), float(2 * i)));
  EXPECT_FALSE(q.urgent());
  FrameInput f = q.take_frame(false);
  EXPECT_EQ(f.taken, 10);
  EXPECT_EQ(f.x, 9.0f);
  EXPECT_EQ(f.y, 18.0f);
  EXPECT_FALSE(f.more);
}

TEST(InputQueue, DifferentButtonsAndKeysChangeInTheSameFrame) {
  InputQueue q;
  q.push(E::button(0, true));
  q.push(E::button(1, true));
  q.push(E::key(GLFW_KEY_LEFT_CONTROL, true));
  q.push(E::key(GLFW_KEY_A, true));
  q.push(E::key(GLFW_KEY_A, false));
  q.push(E::key(GLFW_KEY_LEFT_CONTROL, false));
  FrameInput f1 = q.take_frame(false);
  EXPECT_TRUE(f1.mouse_down[0] && f1.mouse_down[1]);
  EXPECT_TRUE(f1.ctrl);
  EXPECT_TRUE(f1.keys_down[GLFW_KEY_A]) << "Ctrl+A is seen with Ctrl held";
  EXPECT_EQ(f1.taken, 4);
  FrameInput f2 = q.take_frame(false);
  EXPECT_FALSE(f2.keys_down[GLFW_KEY_A]);
  EXPECT_FALSE(f2.ctrl);
  EXPECT_TRUE(f2.mouse_down[0]) << "the buttons stay down";
  EXPECT_TRUE(q.empty());
}

TEST(InputQueue, KeyTapsTrickleOneTransitionPerFrame) {
  InputQueue q;
  for (int i = 0; i < 3; ++i) type_key(q, GLFW_KEY_SPACE, ' ');
  int presses = 0, frames = 0;
  bool was_down = false;
  while (!q.empty() && frames < 20) {
    FrameInput f = q.take_frame(false);
    ++frames;
    if (f.keys_down[GLFW_KEY_SPACE] && !was_down) ++presses;
    was_down = f.keys_down[GLFW_KEY_SPACE];
  }
  EXPECT_EQ(presses, 3) << "three taps, three presses seen";
  EXPECT_EQ(frames, 6);
}

TEST(InputQueue, TypingKeepsUpWhileATextFieldHasTheKeyboard) {
  InputQueue q;
  type_key(q, GLFW_KEY_H, 'h');
  type_key(q, GLFW_KEY_I, 'i');
  type_key(q, GLFW_KEY_H, 'h');
  FrameInput f = q.take_frame(true);
  EXPECT_EQ(f.chars, (std::vector<unsigned>{'h', 'i', 'h'}));
  EXPECT_TRUE(q.empty());
  EXPECT_FALSE(f.keys_down[GLFW_KEY_H]);
}

TEST(InputQueue, KeysThatActKeepTheirOrderWithTheCharacters) {
  InputQueue q;
  type_key(q, GLFW_KEY_A, 'a');
  type_key(q, GLFW_KEY_B, 'b');
  q.push(E::key(GLFW_KEY_BACKSPACE, true));
  q.push(E::key(GLFW_KEY_BACKSPACE, false));
  type_key(q, GLFW_KEY_C, 'c');
  FrameInput f1 = q.take_frame(true);
  EXPECT_EQ(f1.chars, (std::vector<unsigned>{'a', 'b'}));
  EXPECT_FALSE(f1.keys_down[GLFW_KEY_BACKSPACE]) << "Backspace waits for the characters";
  FrameInput f2 = q.take_frame(true);
  EXPECT_TRUE(f2.chars.empty()) << "the character after Backspace waits for it";
  EXPECT_TRUE(f2.keys_down[GLFW_KEY_BACKSPACE]);
  FrameInput f3 = q.take_frame(true);
  EXPECT_FALSE(f3.keys_down[GLFW_KEY_BACKSPACE]);
  EXPECT_EQ(f3.chars, (std::vector<unsigned>{'c'}));
  EXPECT_TRUE(q.empty());
}

TEST(InputQueue, ShortcutLettersAreSeenWithoutATextField) {
  InputQueue q;
  type_key(q, GLFW_KEY_C, 'c');
  FrameInput f1 = q.take_frame(false);
  EXPECT_TRUE(f1.keys_down[GLFW_KEY_C]) << "the press shows for a frame";
  FrameInput f2 = q.take_frame(false);
  EXPECT_FALSE(f2.keys_down[GLFW_KEY_C]);
  EXPECT_TRUE(q.empty());
}

TEST(InputQueue, WheelStepsAddUpAndFocusLossReleasesTheKeys) {
  InputQueue q;
  q.push(E::key(GLFW_KEY_LEFT_SHIFT, true));
  q.push(E::wheel(0, 1));
  q.push(E::wheel(0.5f, 2));
  q.push(E::focus(false));
  FrameInput f = q.take_frame(false);
  EXPECT_EQ(f.wheel_y, 3.0f);
  EXPECT_EQ(f.wheel_x, 0.5f);
  EXPECT_EQ(f.focus, 0);
  EXPECT_FALSE(f.shift);
  FrameInput g = q.take_frame(false);
  EXPECT_EQ(g.wheel_y, 0.0f) << "wheel steps are shown once";
  EXPECT_EQ(g.focus, -1);
}

// The whole path on a headless ImGui context: everything arrives between two frames.
namespace {

class NoLostInput : public ::testing::Test {
 protected:
  kvscope::test::HeadlessImGui imgui_{800, 600, 0.5f};  // a slow machine: 2 frames a second

  void SetUp() override {
    ImGuiIO& io = ImGui::GetIO();
    io.KeyMap[ImGuiKey_A] = GLFW_KEY_A;
    io.KeyMap[ImGuiKey_Delete] = GLFW_KEY_DELETE;
    io.KeyMap[ImGuiKey_Backspace] = GLFW_KEY_BACKSPACE;
    io.KeyMap[ImGuiKey_Space] = GLFW_KEY_SPACE;
    io.KeyMap[ImGuiKey_Enter] = GLFW_KEY_ENTER;
    io.KeyMap[ImGuiKey_LeftArrow] = GLFW_KEY_LEFT;
    io.KeyMap[ImGuiKey_RightArrow] = GLFW_KEY_RIGHT;
    io.KeyMap[ImGuiKey_Home] = GLFW_KEY_HOME;
    io.KeyMap[ImGuiKey_End] = GLFW_KEY_END;
    // Lays the window out.
    frame();
  }

  // One frame, as the app draws it: the queue's share of the input, then a window with a
  // button, a text field and the Space key's handler.
  void frame() {
    ImGuiIO& io = ImGui::GetIO();
    apply_frame_input(queue.take_frame(io.WantTextInput), io);
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(400, 300));
    ImGui::Begin("Toolbar");
    if (ImGui::Button("NO CACHE", ImVec2(120, 30))) ++clicks;
    button_center = center();
    ImGui::InputText("##prompt", text, sizeof text);
    field_center = center();
    if (!io.WantTextInput && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false))
      ++space_presses;
    ImGui::End();
    ImGui::Render();
    seen.push_back(text);
    ++frames;
  }
  // Frames until the queue is empty, and one more; at most `limit`.
  void run(int limit = 60) {
    for (int i = 0; i < limit && !queue.empty(); ++i) frame();
    frame();
  }
  static ImVec2 center() {
    ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
    return ImVec2((a.x + b.x) / 2, (a.y + b.y) / 2);
  }
  void click(ImVec2 at) {
    queue.push(E::pos(at.x, at.y));
    queue.push(E::button(0, true));
    queue.push(E::button(0, false));
  }
  void tap(int key) {
    queue.push(E::key(key, true));
    queue.push(E::key(key, false));
  }

  InputQueue queue;
  ImVec2 button_center, field_center;
  char text[128] = "";
  int clicks = 0, space_presses = 0, frames = 0;
  std::vector<std::string> seen;
};

}  // namespace

TEST_F(NoLostInput, AClickBetweenTwoFramesPressesTheButton) {
  click(button_center);
  queue.push(E::pos(700, 500));  // and away, still before the next frame
  const int before = frames;
  run();
  EXPECT_EQ(clicks, 1);
  EXPECT_LE(frames - before, 4);
}

TEST_F(NoLostInput, ThreeClicksBetweenTwoFramesAreThreeClicks) {
  for (int i = 0; i < 3; ++i) click(button_center);
  run();
  EXPECT_EQ(clicks, 3);
}

TEST_F(NoLostInput, AKeyTapBetweenTwoFramesIsPressed) {
  type_key(queue, GLFW_KEY_SPACE, ' ');
  run();
  EXPECT_EQ(space_presses, 1);
  EXPECT_STREQ(text, "") << "no text field had the keyboard";
}

TEST_F(NoLostInput, TypingThenCtrlAAndDeleteClearTheField) {
  click(field_center);
  for (char c : std::string("hello"))
    type_key(queue, GLFW_KEY_A + (c - 'a'), static_cast<unsigned char>(c));
  queue.push(E::key(GLFW_KEY_LEFT_CONTROL, true));
  tap(GLFW_KEY_A);
  queue.push(E::key(GLFW_KEY_LEFT_CONTROL, false));
  tap(GLFW_KEY_DELETE);
  run();
  EXPECT_NE(std::find(seen.begin(), seen.end(), "hello"), seen.end())
      << "the typed text landed in the field";
  EXPECT_STREQ(text, "") << "Ctrl+A then Delete cleared it";
  EXPECT_EQ(space_presses, 0);
}

TEST_F(NoLostInput, BackspaceBetweenCharactersKeepsItsPlace) {
  click(field_center);
  type_key(queue, GLFW_KEY_A, 'a');
  type_key(queue, GLFW_KEY_B, 'b');
  tap(GLFW_KEY_BACKSPACE);
  type_key(queue, GLFW_KEY_C, 'c');
  run();
  EXPECT_STREQ(text, "ac");
}

// The toolbar's C key, tapped between two frames, switches the cache mode once.
TEST_F(NoLostInput, TheCKeySwitchesTheCacheModeOnce) {
  UiState ui;
  ui.engine_ready = true;
  ControllerState cs;
  Timeline tl;
  auto toolbar_frame = [&] {
    ImGuiIO& io = ImGui::GetIO();
    apply_frame_input(queue.take_frame(io.WantTextInput), io);
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(800, 60));
    ImGui::Begin("Toolbar");
    panel_toolbar(ui, nullptr, cs, tl);
    ImGui::End();
    ImGui::Render();
  };
  ASSERT_EQ(ui.mode, kvscope::CacheMode::Cache);
  type_key(queue, GLFW_KEY_C, 'c');
  for (int i = 0; i < 4; ++i) toolbar_frame();
  EXPECT_EQ(ui.mode, kvscope::CacheMode::NoCache);
  type_key(queue, GLFW_KEY_C, 'c');
  for (int i = 0; i < 4; ++i) toolbar_frame();
  EXPECT_EQ(ui.mode, kvscope::CacheMode::Cache);
}
