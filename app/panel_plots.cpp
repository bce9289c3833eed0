// panel_plots.cpp — measured per-step time and FLOPs over the run, with the other cache
// mode's measured curves overlaid only when that mode has really run on this prompt.
//
// Colors identify the mode of each step (KV CACHE blue, NO CACHE orange), so a run that
// switched modes mid-run shows its segments in both colors. This run is drawn thick,
// the earlier run of the other mode thin. No curve here is computed from a formula.
// Draws content only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "app/ui_state.h"

namespace kvscope::app {
namespace {

const ImU32 kCacheCol = IM_COL32(110, 190, 255, 255);
const ImU32 kNoCacheCol = IM_COL32(255, 135, 70, 255);
ImU32 mode_color(CacheMode m) { return m == CacheMode::Cache ? kCacheCol : kNoCacheCol; }
ImVec4 mode_color_v(CacheMode m) { return ImGui::ColorConvertU32ToFloat4(mode_color(m)); }
const char* mode_label(CacheMode m) { return m == CacheMode::Cache ? "KV CACHE" : "NO CACHE"; }

struct Curve {
  const RunSeries* s = nullptr;
  bool flops = false;  // which series: FLOPs or ms
  float thickness = 2.0f;
  double value(size_t i) const { return flops ? s->flops[i] : s->ms[i]; }
};

// Curves on a shared axis (step index on x, 0..max on y) in one framed box; every segment
// takes the color of the mode its right-hand step ran in.
void plot_curves(const char* id, const std::vector<Curve>& curves, ImVec2 size, bool counts,
                 const char* unit) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImVec2 p1(p0.x + size.x, p0.y + size.y);
  ImGui::InvisibleButton(id, size);
  bool hovered = ImGui::IsItemHovered();
  dl->AddRectFilled(p0, p1, IM_COL32(20, 22, 30, 255), 3.0f);
  double mx = 1e-9;
  size_t n = 0;
  for (const Curve& c : curves) {
    n = std::max(n, c.s->steps());
    for (size_t i = 0; i < c.s->steps(); ++i) mx = std::max(mx, c.value(i));
  }
  if (n == 0) return;
  auto pt = [&](size_t i, double v) {
    float fx = n > 1 ? float(i) / float(n - 1) : 0.5f;
    return ImVec2(p0.x + 4 + (size.x - 8) * fx, p1.y - 4 - (size.y - 18) * float(v / mx));
  };
  for (const Curve& c : curves) {
    size_t m = c.s->steps();
    if (m == 1) dl->AddCircleFilled(pt(0, c.value(0)), c.thickness + 1, mode_color(c.s->step_mode[0]));
    for (size_t i = 1; i < m; ++i)
      dl->AddLine(pt(i - 1, c.value(i - 1)), pt(i, c.value(i)), mode_color(c.s->step_mode[i]),
                  c.thickness);
  }
  char top[64];
  if (counts)
    std::snprintf(top, sizeof top, "%s %s", format_count(mx).c_str(), unit);
  else
    std::snprintf(top, sizeof top, "%.1f %s", mx, unit);
  dl->AddText(ImVec2(p0.x + 6, p0.y + 2), IM_COL32(180, 180, 190, 255), top);
  char steps[32];
  std::snprintf(steps, sizeof steps, "%zu steps", n);
  ImVec2 ts = ImGui::CalcTextSize(steps);
  dl->AddText(ImVec2(p1.x - ts.x - 6, p0.y + 2), IM_COL32(140, 140, 150, 255), steps);
  if (hovered) {
    float fx = (ImGui::GetIO().MousePos.x - p0.x - 4) / std::max(size.x - 8, 1.0f);
    size_t i = n > 1 ? size_t(std::clamp(fx, 0.0f, 1.0f) * float(n - 1) + 0.5f) : 0;
    ImGui::BeginTooltip();
    ImGui::Text("step %zu", i + 1);
    for (const Curve& c : curves) {
      if (i >= c.s->steps()) continue;
      ImGui::TextColored(mode_color_v(c.s->step_mode[i]), "%s: %s", mode_label(c.s->step_mode[i]),
                         counts ? (format_count(c.value(i)) + " " + unit).c_str()
                                : (std::to_string(c.value(i)).substr(0, 7) + " " + unit).c_str());
    }
    ImGui::EndTooltip();
  }
}

void legend(const RunSeries& s, const char* which) {
  ImGui::TextColored(mode_color_v(s.mode), "%s %s", s.mixed() ? "--" : "==", mode_label(s.mode));
  ImGui::SameLine();
  ImGui::TextDisabled("%s, %zu steps%s%s", which, s.steps(), s.finished ? "" : " so far",
                      s.mixed() ? ", switched modes (segments colored by mode)" : "");
}

}  // namespace

void panel_plots(const UiState& ui, const Timeline& tl) {
  (void)ui;
  const RunSeries* cur = tl.current_series();
  const RunSeries* other = tl.other_series();
  if (!cur) {
    ImGui::TextDisabled("no steps yet in this run");
    if (other) legend(*other, "earlier run on this prompt");
  } else {
    legend(*cur, "this run");
    if (other)
      legend(*other, "earlier run on this prompt");
    else
      ImGui::TextDisabled("run the other mode on this prompt to compare");
  }
  std::vector<Curve> ms, flops;
  if (other) {
    ms.push_back({other, false, 1.5f});
    flops.push_back({other, true, 1.5f});
  }
  if (cur) {
    ms.push_back({cur, false, 2.5f});
    flops.push_back({cur, true, 2.5f});
  }
  float w = ImGui::GetContentRegionAvail().x;
  ImGui::Text("step time (measured)");
  plot_curves("##ms", ms, ImVec2(w, 95), false, "ms");
  ImGui::Text("FLOPs per step (measured)");
  plot_curves("##flops", flops, ImVec2(w, 95), true, "FLOP");

  // KV bytes of this run: held by the cache plus recomputed-and-discarded (NO CACHE).
  std::vector<double> kv;
  for (const auto& sp : tl.steps()) kv.push_back(double(sp->kv_bytes + sp->kv_transient_bytes));
  if (!kv.empty()) {
    ImGui::Text("KV bytes per step (held + recomputed)");
    ImDrawList* dl = ImGui::GetWindowDrawList();
    ImVec2 size(w, 48), p0 = ImGui::GetCursorScreenPos(), p1(p0.x + size.x, p0.y + size.y);
    ImGui::Dummy(size);
    dl->AddRectFilled(p0, p1, IM_COL32(20, 22, 30, 255), 3.0f);
    double mx = std::max(1.0, *std::max_element(kv.begin(), kv.end()));
    std::vector<ImVec2> pts;
    for (size_t i = 0; i < kv.size(); ++i)
      pts.emplace_back(p0.x + 4 + (size.x - 8) * (kv.size() > 1 ? float(i) / float(kv.size() - 1) : 0.5f),
                       p1.y - 4 - (size.y - 18) * float(kv[i] / mx));
    if (pts.size() >= 2) dl->AddPolyline(pts.data(), int(pts.size()), IM_COL32(120, 230, 190, 255), 0, 2.0f);
    dl->AddText(ImVec2(p0.x + 6, p0.y + 2), IM_COL32(180, 180, 190, 255),
                format_bytes(uint64_t(mx)).c_str());
  }
}

}  // namespace kvscope::app
