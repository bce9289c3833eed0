// input_queue.h — the window's input, queued in order and handed to Dear ImGui a frame at a
// time, so that no press, release, key or character is lost however long a frame takes.
//
// Dear ImGui 1.86 reads the mouse buttons and the keys as a state once per frame
// (io.MouseDown[], io.KeysDown[]): a button pressed and released within one frame is never
// seen, and at two frames a second a quick click or key tap usually is. Here the window's
// callbacks push every event into an InputQueue; each frame takes from its front only what
// one frame can show:
//   - a mouse button or a key changes at most once per frame: the event that would change
//     it a second time stays queued for the next frame (a click is a press in one frame and
//     the release in the next);
//   - the pointer's moves batch, but not past a button change: a click lands where it was
//     made, and the pointer moves on in the next frame;
//   - characters and wheel steps batch;
//   - keys and characters keep their order where it matters to a text field: a key that
//     acts (Delete, Enter, Ctrl, ...: any but Shift that types nothing) waits for the
//     next frame after characters typed before it, and characters wait after such a key
//     (ImGui's text field ignores characters while Ctrl is held). While a text field has the
//     keyboard, the letter keys that typed the characters may go down and up within a
//     frame, so typing keeps up with the hands.
// The loop draws the next frame at once while a button, key, character or wheel event
// waits (urgent()), so a click is answered within a frame or two. No GLFW here: the events
// are plain structs, and key codes are ImGui 1.86's key indexes (the GLFW key codes in this
// app; the modifier keys' codes below are GLFW's).
#pragma once

#include <array>
#include <cstddef>
#include <deque>
#include <vector>

struct ImGuiIO;

namespace kvscope::app {

inline constexpr int kMouseButtons = 5;  // io.MouseDown[]
inline constexpr int kInputKeys = 512;   // io.KeysDown[]

// The modifier keys (GLFW's key codes).
inline constexpr int kKeyLeftShift = 340, kKeyLeftControl = 341, kKeyLeftAlt = 342,
                     kKeyLeftSuper = 343, kKeyRightShift = 344, kKeyRightControl = 345,
                     kKeyRightAlt = 346, kKeyRightSuper = 347;

struct InputEvent {
  enum class Kind { MousePos, MouseButton, Key, Char, Wheel, Focus };
  Kind kind = Kind::MousePos;
  int code = 0;        // MouseButton: the button; Key: the key index
  bool down = false;   // MouseButton, Key: pressed (false: released); Focus: gained
  float x = 0, y = 0;  // MousePos: the pointer; Wheel: the horizontal and vertical steps
  unsigned ch = 0;     // Char: the Unicode code point

  static InputEvent pos(float x, float y) { return {Kind::MousePos, 0, false, x, y, 0}; }
  static InputEvent button(int b, bool down) { return {Kind::MouseButton, b, down, 0, 0, 0}; }
  static InputEvent key(int k, bool down) { return {Kind::Key, k, down, 0, 0, 0}; }
  static InputEvent character(unsigned c) { return {Kind::Char, 0, false, 0, 0, c}; }
  static InputEvent wheel(float x, float y) { return {Kind::Wheel, 0, false, x, y, 0}; }
  static InputEvent focus(bool gained) { return {Kind::Focus, 0, gained, 0, 0, 0}; }
};

// What one frame shows: the buttons and keys as they stand after the events taken, the
// characters and wheel steps among them, and where the pointer was at the last move taken.
struct FrameInput {
  std::array<bool, kMouseButtons> mouse_down{};
  std::array<bool, kInputKeys> keys_down{};
  bool ctrl = false, shift = false, alt = false, super = false;
  std::vector<unsigned> chars;
  float wheel_x = 0, wheel_y = 0;
  bool has_pos = false;  // a pointer position was ever queued (x, y are valid)
  float x = 0, y = 0;
  bool button_changed = false;  // a mouse button went down or up this frame
  int focus = -1;               // the window's focus changed: 1 gained, 0 lost; -1 no change
  int taken = 0;                // events taken from the queue
  bool more = false;            // events still wait for later frames
};

class InputQueue {
 public:
  void push(const InputEvent& e) { q_.push_back(e); }
  // The events the next frame can show, by the rules above; text_input: a text field has
  // the keyboard (io.WantTextInput of the frame before).
  FrameInput take_frame(bool text_input);
  bool empty() const { return q_.empty(); }
  size_t size() const { return q_.size(); }
  // A button, key, character or wheel event waits: draw the next frame now.
  bool urgent() const;

 private:
  std::deque<InputEvent> q_;
  FrameInput state_;                         // buttons, keys and pointer as last shown
  std::array<bool, kInputKeys> text_key_{};  // the key's last press typed a character
};

// Hands one frame's input to Dear ImGui; call after the platform backend's NewFrame (which
// samples the mouse buttons) and before ImGui::NewFrame. The pointer position is set only
// when the frame took a button change or events still wait (then the frame must show where
// the pointer was then, not where it is now); otherwise the backend's is the newest.
void apply_frame_input(const FrameInput& in, ImGuiIO& io);

}  // namespace kvscope::app
