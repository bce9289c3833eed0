// overview_marks.h — what the overview strip draws for one step's attention, readable at any
// sequence length: a bar per pixel column and the strongest targets marked.
//
// The scale is the strip's own: the tallest bar is the strongest position other than the
// sink (position 0 usually holds most of the weight and would flatten everything else),
// heights fall with log10 of the ratio to it over kOverviewDecades, and the sink, when it is
// stronger, is drawn full height in a colour of its own. Pure arithmetic (no ImGui), so the
// strip and its tests agree.
#pragma once

#include <vector>

namespace kvscope::app {

inline constexpr float kOverviewDecades = 2.0f;
inline constexpr int kOverviewTopMarks = 8;

struct OverviewMarks {
  std::vector<float> height;  // [cols] bar height in [0, 1] (the strongest position in the column)
  int sink_column = -1;       // column of position 0 when it is above the scale, else -1
  std::vector<int> top;       // up to top_n strongest positions other than 0, strongest first
  std::vector<int> top_column;  // [top] their columns
};

// Column of position `pos` when `slots` positions share `cols` pixel columns.
int overview_column(int pos, int slots, int cols);

// Marks for weights `w` over positions [0, w.size()) spread over `slots` slots (positions
// plus the head's slot) and `cols` columns.
OverviewMarks overview_marks(const std::vector<float>& w, int slots, int cols,
                             int top_n = kOverviewTopMarks);

}  // namespace kvscope::app
