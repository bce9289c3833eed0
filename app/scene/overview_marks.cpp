// overview_marks.cpp — bar heights and top marks for the overview strip (overview_marks.h).
#include "app/scene/overview_marks.h"

#include <algorithm>
#include <cmath>

namespace kvscope::app {

int overview_column(int pos, int slots, int cols) {
  if (slots <= 0 || cols <= 0) return 0;
  return std::clamp(int(float(cols) * (float(pos) + 0.5f) / float(slots)), 0, cols - 1);
}

OverviewMarks overview_marks(const std::vector<float>& w, int slots, int cols, int top_n) {
  OverviewMarks m;
  cols = std::max(cols, 1);
  m.height.assign(size_t(cols), 0.0f);
  const int n = int(w.size());
  if (n == 0) return m;
  // The strip's scale: the strongest position after the sink (or the sink when alone).
  float ref = 0.0f;
  for (int j = 1; j < n; ++j) ref = std::max(ref, w[size_t(j)]);
  if (!(ref > 0.0f)) ref = w[0];
  if (!(ref > 0.0f)) return m;
  auto height = [&](float x) {
    if (!(x > 0.0f)) return 0.0f;
    return std::clamp(1.0f + std::log10(x / ref) / kOverviewDecades, 0.0f, 1.0f);
  };
  for (int j = 0; j < n; ++j) {
    float& h = m.height[size_t(overview_column(j, slots, cols))];
    h = std::max(h, height(w[size_t(j)]));
  }
  if (n > 1 && w[0] > ref) m.sink_column = overview_column(0, slots, cols);

  // The strongest targets, one per column (neighbours sharing a column are one mark).
  std::vector<int> order;
  for (int j = 1; j < n; ++j)
    if (w[size_t(j)] > 0.0f) order.push_back(j);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return w[size_t(a)] > w[size_t(b)]; });
  for (int j : order) {
    if (int(m.top.size()) >= top_n) break;
    const int c = overview_column(j, slots, cols);
    if (std::find(m.top_column.begin(), m.top_column.end(), c) != m.top_column.end()) continue;
    m.top.push_back(j);
    m.top_column.push_back(c);
  }
  return m;
}

}  // namespace kvscope::app
