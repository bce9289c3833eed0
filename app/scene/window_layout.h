// window_layout.h — where the app's regions go in the window: a toolbar along the top, a
// docked column on each side, a strip along the bottom, the story strip under the 3D view
// (between the columns), and the 3D view in what is left.
//
// Pure arithmetic on window coordinates (ImGui's: origin top-left, y down, in window
// points; multiply by the framebuffer scale for pixels). No ImGui, no GL: the window,
// the headless capture and the tests compute the same rectangles from the same inputs.
// Invariants: the regions never overlap; together they tile the window exactly; the
// view is never empty (columns give way first, then collapse, on small windows).
#pragma once

namespace kvscope::app {

struct UiRect {
  float x = 0, y = 0, w = 0, h = 0;
  float right() const { return x + w; }
  float bottom() const { return y + h; }
  bool contains(float px, float py) const { return px >= x && py >= y && px < x + w && py < y + h; }
  bool empty() const { return w <= 0 || h <= 0; }
};

// A side column is open (its sections shown), closed (a thin strip with a button), or
// automatic: open when the window is wide enough to keep a useful view beside it.
enum class ColumnMode { Auto, Open, Closed };

struct LayoutPrefs {
  ColumnMode left = ColumnMode::Auto, right = ColumnMode::Auto;
  float left_width = 0, right_width = 0;  // preferred open widths in points; 0 = automatic
  float bottom_height = 0;                // bottom strip height in points; 0 = automatic
};

struct UiLayout {
  UiRect toolbar;      // transport, cache mode, camera presets, export
  UiRect left, right;  // the side columns (a thin strip when closed)
  UiRect bottom;       // overview strip of the whole sequence (and the timeline)
  UiRect story;        // under the view, between the columns: the stats, the text, the next token
  UiRect view;         // the 3D scene: the rectangle the panels leave free
  bool left_open = true, right_open = true;
};

// Sizes at a UI scale of 1 (multiplied by `scale` for HiDPI).
inline constexpr float kToolbarHeight = 40.0f;
inline constexpr float kClosedColumnWidth = 28.0f;
inline constexpr float kMinColumnWidth = 260.0f, kMaxColumnWidth = 420.0f;
inline constexpr float kBottomHeight = 76.0f;
// The story strip: a line of stats over four lines of text and candidates, never scrolled.
inline constexpr float kStoryHeight = 112.0f;
inline constexpr float kMinViewWidth = 420.0f;  // auto columns close before the view gets narrower
inline constexpr float kMinViewHeight = 160.0f;

// The regions for a `width` x `height` window (points) with `prefs`.
UiLayout compute_layout(float width, float height, const LayoutPrefs& prefs, float scale = 1.0f);

}  // namespace kvscope::app
