// window_layout.cpp — the region arithmetic (see window_layout.h).
#include "app/scene/window_layout.h"

#include <algorithm>

namespace kvscope::app {

UiLayout compute_layout(float width, float height, const LayoutPrefs& prefs, float scale) {
  scale = std::max(scale, 0.5f);
  width = std::max(width, 1.0f);
  height = std::max(height, 1.0f);
  UiLayout out;

  // Vertical bands: toolbar, middle (columns + story strip under the view), bottom strip.
  // The story strip, the bottom strip and then the toolbar give way on very short windows
  // so the view keeps some height.
  float toolbar_h = kToolbarHeight * scale;
  float bottom_h = (prefs.bottom_height > 0 ? prefs.bottom_height : kBottomHeight) * scale;
  float story_h = kStoryHeight * scale;
  float min_view_h = std::min(kMinViewHeight * scale, height * 0.5f);
  if (height - toolbar_h - bottom_h - story_h < min_view_h)
    story_h = std::max(0.0f, height - toolbar_h - bottom_h - min_view_h);
  if (height - toolbar_h - bottom_h < min_view_h)
    bottom_h = std::max(0.0f, height - toolbar_h - min_view_h);
  if (height - toolbar_h < min_view_h) toolbar_h = std::max(0.0f, height - min_view_h);
  const float mid_y = toolbar_h, mid_h = std::max(1.0f, height - toolbar_h - bottom_h);

  // Columns: automatic ones open while the view keeps at least half the window (and
  // kMinViewWidth); the left column (controls) opens before the right one.
  const float closed_w = kClosedColumnWidth * scale;
  auto open_width = [&](float pref) {
    float w = pref > 0 ? pref * scale
                       : std::clamp(width * 0.24f, kMinColumnWidth, kMaxColumnWidth) * scale;
    return std::min(w, width * 0.45f);
  };
  float lw = open_width(prefs.left_width), rw = open_width(prefs.right_width);
  const float min_view_w = std::max(kMinViewWidth * scale, width * 0.5f);
  bool left = prefs.left != ColumnMode::Closed, right = prefs.right != ColumnMode::Closed;
  auto view_w = [&] { return width - (left ? lw : closed_w) - (right ? rw : closed_w); };
  if (right && prefs.right == ColumnMode::Auto && view_w() < min_view_w) right = false;
  if (left && prefs.left == ColumnMode::Auto && view_w() < min_view_w) left = false;
  // Columns the user opened shrink (never below half their width) before they close.
  const float hard_min = std::min(kMinViewWidth * scale, width * 0.4f);
  for (int pass = 0; pass < 2 && view_w() < hard_min; ++pass) {
    float need = hard_min - view_w();
    float give_l = left ? std::min(need * 0.5f, lw * 0.5f) : 0.0f;
    float give_r = right ? std::min(need - give_l, rw * 0.5f) : 0.0f;
    lw -= give_l;
    rw -= give_r;
    if (view_w() < hard_min) {
      if (right)
        right = false;
      else if (left)
        left = false;
    }
  }
  if (!left) lw = closed_w;
  if (!right) rw = closed_w;
  // Very narrow windows: even the closed strips give way.
  lw = std::min(lw, width * 0.25f);
  rw = std::min(rw, width * 0.25f);

  out.left_open = left;
  out.right_open = right;
  out.toolbar = {0, 0, width, toolbar_h};
  out.left = {0, mid_y, lw, mid_h};
  out.right = {width - rw, mid_y, rw, mid_h};
  const float view_h = std::max(1.0f, mid_h - story_h);
  out.view = {lw, mid_y, std::max(1.0f, width - lw - rw), view_h};
  out.story = {lw, mid_y + view_h, out.view.w, mid_h - view_h};
  out.bottom = {0, mid_y + mid_h, width, bottom_h};
  return out;
}

}  // namespace kvscope::app
