// input_queue.cpp — the window's input, a frame at a time (see input_queue.h).
#include "app/ui/input_queue.h"

#include <imgui.h>

#include <algorithm>

namespace kvscope::app {

bool InputQueue::urgent() const {
  return std::any_of(q_.begin(), q_.end(), [](const InputEvent& e) {
    return e.kind != InputEvent::Kind::MousePos && e.kind != InputEvent::Kind::Focus;
  });
}

FrameInput InputQueue::take_frame(bool text_input) {
  using Kind = InputEvent::Kind;
  FrameInput out = state_;
  out.chars.clear();
  out.wheel_x = out.wheel_y = 0;
  out.button_changed = false;
  out.focus = -1;
  out.taken = 0;
  std::array<bool, kMouseButtons> button_changed{};
  std::array<bool, kInputKeys> key_changed{};
  bool typed = false;      // characters taken this frame
  bool key_acted = false;  // a key that acts (typed nothing, not Shift) went down
  while (!q_.empty()) {
    const InputEvent& e = q_.front();
    bool stop = false;
    switch (e.kind) {
      case Kind::MousePos:
        if (out.button_changed) {
          stop = true;
          break;
        }
        out.has_pos = true;
        out.x = e.x;
        out.y = e.y;
        break;
      case Kind::MouseButton: {
        if (e.code < 0 || e.code >= kMouseButtons) break;
        const size_t b = size_t(e.code);
        if (out.mouse_down[b] == e.down) break;  // no change
        if (button_changed[b]) {
          stop = true;
          break;
        }
        out.mouse_down[b] = e.down;
        button_changed[b] = true;
        out.button_changed = true;
        break;
      }
      case Kind::Key: {
        if (e.code < 0 || e.code >= kInputKeys) break;
        const size_t k = size_t(e.code);
        if (out.keys_down[k] == e.down) break;  // no change
        // A press that types a character is followed by it (the window reports both at once).
        const bool types = e.down ? q_.size() > 1 && q_[1].kind == Kind::Char : text_key_[k];
        // Shift only changes what is typed; a text field ignores characters while Ctrl
        // (without Alt) or Super is held, so those count as keys that act.
        const bool shift = e.code == kKeyLeftShift || e.code == kKeyRightShift;
        const bool acts = e.down && !types && !shift;
        if ((key_changed[k] && !(text_input && types)) || (acts && typed)) {
          stop = true;
          break;
        }
        if (e.down) text_key_[k] = types;
        out.keys_down[k] = e.down;
        key_changed[k] = true;
        key_acted = key_acted || acts;
        break;
      }
      case Kind::Char:
        if (key_acted) {
          stop = true;
          break;
        }
        out.chars.push_back(e.ch);
        typed = true;
        break;
      case Kind::Wheel:
        out.wheel_x += e.x;
        out.wheel_y += e.y;
        break;
      case Kind::Focus:
        out.focus = e.down ? 1 : 0;
        if (!e.down) out.keys_down.fill(false);  // ImGui forgets the keys when focus goes
        break;
    }
    if (stop) break;
    q_.pop_front();
    ++out.taken;
  }
  const auto& k = out.keys_down;
  out.ctrl = k[kKeyLeftControl] || k[kKeyRightControl];
  out.shift = k[kKeyLeftShift] || k[kKeyRightShift];
  out.alt = k[kKeyLeftAlt] || k[kKeyRightAlt];
  out.super = k[kKeyLeftSuper] || k[kKeyRightSuper];
  out.more = !q_.empty();
  state_ = out;
  return out;
}

void apply_frame_input(const FrameInput& in, ImGuiIO& io) {
  if (in.focus >= 0) io.AddFocusEvent(in.focus == 1);
  for (int b = 0; b < kMouseButtons; ++b) io.MouseDown[b] = in.mouse_down[size_t(b)];
  if (in.has_pos && (in.button_changed || in.more)) io.MousePos = ImVec2(in.x, in.y);
  for (int k = 0; k < kInputKeys; ++k) io.KeysDown[k] = in.keys_down[size_t(k)];
  io.KeyCtrl = in.ctrl;
  io.KeyShift = in.shift;
  io.KeyAlt = in.alt;
  io.KeySuper = in.super;
  for (unsigned c : in.chars) io.AddInputCharacter(c);
  io.MouseWheel += in.wheel_y;
  io.MouseWheelH += in.wheel_x;
}

}  // namespace kvscope::app
