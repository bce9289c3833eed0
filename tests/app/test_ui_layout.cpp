// test_ui_layout.cpp — the window's regions at every size from 1024x640 up: they tile the
// window without overlapping, the 3D view keeps a useful share, the story strip sits under
// it at full height, columns close and open as asked, and the layout follows a resize.
#include <gtest/gtest.h>

#include <algorithm>

#include "app/scene/window_layout.h"

using namespace kvscope::app;

namespace {

float overlap_area(const UiRect& a, const UiRect& b) {
  float w = std::min(a.right(), b.right()) - std::max(a.x, b.x);
  float h = std::min(a.bottom(), b.bottom()) - std::max(a.y, b.y);
  return w > 0 && h > 0 ? w * h : 0.0f;
}

void expect_tiles(const UiLayout& L, float W, float H, const char* what) {
  const UiRect* r[] = {&L.toolbar, &L.left, &L.right, &L.bottom, &L.view, &L.story};
  float area = 0;
  for (int i = 0; i < 6; ++i) {
    area += r[i]->w * r[i]->h;
    EXPECT_GE(r[i]->x, 0.0f) << what;
    EXPECT_GE(r[i]->y, 0.0f) << what;
    EXPECT_LE(r[i]->right(), W + 0.01f) << what;
    EXPECT_LE(r[i]->bottom(), H + 0.01f) << what;
    for (int j = i + 1; j < 6; ++j)
      EXPECT_EQ(overlap_area(*r[i], *r[j]), 0.0f) << what << " " << i << "/" << j;
  }
  EXPECT_NEAR(area, W * H, W * H * 1e-4f) << what;
}

}  // namespace

TEST(UiLayout, RegionsTileEveryWindowSizeAndTheViewKeepsHalfTheWidth) {
  for (float W : {1024.f, 1100.f, 1280.f, 1366.f, 1600.f, 1920.f, 2560.f, 3840.f})
    for (float H : {640.f, 720.f, 900.f, 1080.f, 2160.f}) {
      UiLayout L = compute_layout(W, H, LayoutPrefs{});
      std::string what = std::to_string(int(W)) + "x" + std::to_string(int(H));
      expect_tiles(L, W, H, what.c_str());
      EXPECT_GE(L.view.w, 0.5f * W - 0.01f) << what;
      EXPECT_GE(L.view.h, 0.6f * H) << what;
      EXPECT_TRUE(L.left_open) << what;  // the controls always fit from 1024 up
    }
}

// The story strip (COMPUTE, KV_CACHE, SEQ_LEN, the transcript, the candidates) is there at
// its full height at every size from 1024x640 up, right under the view and as wide as it,
// whichever columns are open.
TEST(UiLayout, TheStoryStripSitsUnderTheViewAtEverySize) {
  for (float W : {1024.f, 1280.f, 1920.f, 3840.f})
    for (float H : {640.f, 720.f, 1080.f, 2160.f})
      for (ColumnMode m : {ColumnMode::Auto, ColumnMode::Open, ColumnMode::Closed}) {
        LayoutPrefs prefs;
        prefs.left = prefs.right = m;
        UiLayout L = compute_layout(W, H, prefs);
        std::string what = std::to_string(int(W)) + "x" + std::to_string(int(H));
        EXPECT_NEAR(L.story.h, kStoryHeight, 0.01f) << what;
        EXPECT_NEAR(L.story.y, L.view.bottom(), 0.01f) << what;
        EXPECT_NEAR(L.story.x, L.view.x, 0.01f) << what;
        EXPECT_NEAR(L.story.w, L.view.w, 0.01f) << what;
        EXPECT_NEAR(L.story.bottom(), L.bottom.y, 0.01f) << what;
      }
}

TEST(UiLayout, NarrowWindowsCloseTheRightColumnFirstWideOnesOpenBoth) {
  UiLayout small = compute_layout(1024, 640, LayoutPrefs{});
  EXPECT_TRUE(small.left_open);
  EXPECT_FALSE(small.right_open);
  EXPECT_LE(small.right.w, kClosedColumnWidth);
  UiLayout wide = compute_layout(1920, 1080, LayoutPrefs{});
  EXPECT_TRUE(wide.left_open && wide.right_open);
  EXPECT_GE(wide.right.w, kMinColumnWidth);
}

TEST(UiLayout, ClosingAColumnGivesItsRoomToTheView) {
  LayoutPrefs prefs;
  UiLayout both = compute_layout(1600, 900, prefs);
  prefs.left = ColumnMode::Closed;
  UiLayout no_left = compute_layout(1600, 900, prefs);
  EXPECT_FALSE(no_left.left_open);
  EXPECT_NEAR(no_left.view.w - both.view.w, both.left.w - no_left.left.w, 0.01f);
  EXPECT_NEAR(no_left.view.x, kClosedColumnWidth, 0.01f);
  prefs.right = ColumnMode::Closed;
  UiLayout none = compute_layout(1600, 900, prefs);
  EXPECT_NEAR(none.view.w, 1600 - 2 * kClosedColumnWidth, 0.01f);
  // A column the user opens stays open even where automatic mode would close it.
  prefs.left = prefs.right = ColumnMode::Open;
  UiLayout forced = compute_layout(1024, 640, prefs);
  EXPECT_TRUE(forced.left_open && forced.right_open);
  expect_tiles(forced, 1024, 640, "forced open");
  EXPECT_GE(forced.view.w, kMinViewWidth - 0.01f);
}

TEST(UiLayout, FollowsAResizeAndScalesForHiDpi) {
  LayoutPrefs prefs;
  UiLayout a = compute_layout(1280, 720, prefs);
  UiLayout b = compute_layout(1700, 1000, prefs);
  EXPECT_GT(b.view.w, a.view.w);
  EXPECT_GT(b.view.h, a.view.h);
  EXPECT_NEAR(b.right.right(), 1700, 0.01f);  // the right column stays docked to the edge
  EXPECT_NEAR(b.bottom.bottom(), 1000, 0.01f);
  UiLayout hi = compute_layout(2560, 1440, prefs, 2.0f);
  EXPECT_NEAR(hi.toolbar.h, 2 * kToolbarHeight, 0.01f);
  expect_tiles(hi, 2560, 1440, "hidpi");
}

TEST(UiLayout, TinyWindowsStillGetAView) {
  for (auto [W, H] : {std::pair{320.f, 200.f}, std::pair{640.f, 400.f}, std::pair{200.f, 900.f}}) {
    UiLayout L = compute_layout(W, H, LayoutPrefs{});
    expect_tiles(L, W, H, "tiny");
    EXPECT_GT(L.view.w, 0.3f * W);
    EXPECT_GT(L.view.h, 0.3f * H);
  }
}
