// plot_draw.cpp — see plot_draw.h.
#include "app/ui/plot_draw.h"

#include <algorithm>
#include <cstdio>

#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

const ImU32 kFrame = IM_COL32(20, 22, 30, 255);
const ImU32 kGrid = IM_COL32(60, 64, 78, 255);
const ImU32 kText = IM_COL32(170, 172, 184, 255);

// Round tick spacing (1, 2 or 5 times a power of ten) giving about `want` ticks over span.
double nice_step(double span, int want) {
  if (!(span > 0)) return 1.0;
  double raw = span / std::max(want, 1);
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10.0 * p;
}

void dashed_line(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col, float th) {
  const float len = std::hypot(b.x - a.x, b.y - a.y);
  const int n = std::max(1, int(len / 6.0f));
  for (int i = 0; i < n; i += 2) {
    float t0 = float(i) / float(n), t1 = std::min(1.0f, float(i + 1) / float(n));
    dl->AddLine(ImVec2(a.x + (b.x - a.x) * t0, a.y + (b.y - a.y) * t0),
                ImVec2(a.x + (b.x - a.x) * t1, a.y + (b.y - a.y) * t1), col, th);
  }
}

}  // namespace

std::string plot_value_label(double v, PlotUnit unit, const char* suffix) {
  char buf[64];
  switch (unit) {
    case PlotUnit::Milliseconds:
      if (v >= 10000)
        std::snprintf(buf, sizeof buf, "%.0f s", v / 1000.0);
      else if (v >= 1000)
        std::snprintf(buf, sizeof buf, "%.1f s", v / 1000.0);
      else
        std::snprintf(buf, sizeof buf, v >= 10 || v == 0 ? "%.0f ms" : "%.1f ms", v);
      return buf;
    case PlotUnit::Bytes:
      return format_bytes(uint64_t(std::max(v, 0.0)));
    case PlotUnit::Count:
      break;
  }
  // Axis style: three significant digits at most, SI prefix (60k, 1.5M, 400G).
  const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (std::abs(v) >= 1000.0 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  std::snprintf(buf, sizeof buf, "%.3g%s%s", v, units[u], suffix);
  return buf;
}

void draw_plot(const PlotSpec& spec, const std::vector<PlotSeries>& series) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float w = std::max(ImGui::GetContentRegionAvail().x, 80.0f);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(spec.id, ImVec2(w, spec.height));
  const bool hovered = ImGui::IsItemHovered();
  const float lh = ImGui::GetTextLineHeight();

  // Ranges.
  double x0 = INFINITY, x1 = -INFINITY, y1 = 0, ymin_pos = INFINITY;
  for (const PlotSeries& s : series) {
    if (!s.x || !s.y) continue;
    for (size_t i = 0; i < std::min(s.x->size(), s.y->size()); ++i) {
      x0 = std::min(x0, (*s.x)[i]);
      x1 = std::max(x1, (*s.x)[i]);
      y1 = std::max(y1, (*s.y)[i]);
      if ((*s.y)[i] > 0) ymin_pos = std::min(ymin_pos, (*s.y)[i]);
    }
  }
  const float label_w = ImGui::CalcTextSize("000.0M FLOP").x * 0.8f + 6.0f;
  const ImVec2 a(p0.x + label_w, p0.y + lh * 0.5f);                 // plot area, top left
  const ImVec2 b(p0.x + w - 6.0f, p0.y + spec.height - lh - 4.0f);  // bottom right
  dl->AddRectFilled(a, b, kFrame, 2.0f);
  if (!(x1 >= x0) || y1 <= 0) {
    dl->AddText(ImVec2(a.x + 6, a.y + 4), kText, "no data yet");
    return;
  }
  if (x1 == x0) x1 = x0 + 1;
  const bool log_y = spec.log_y && ymin_pos < INFINITY;
  // Byte axes step in round numbers of their binary unit (256 KiB, 1 MiB), not of bytes
  // (which gave 488.3 KiB, 976.6 KiB).
  auto y_step = [&](double span, int want) {
    if (spec.y_unit != PlotUnit::Bytes) return nice_step(span, want);
    double unit = 1.0;
    while (unit * 1024.0 <= span) unit *= 1024.0;
    return nice_step(span / unit, want) * unit;
  };
  double ylo = 0, yhi = y1;
  if (log_y) {
    ylo = std::pow(10.0, std::floor(std::log10(ymin_pos)));
    yhi = std::pow(10.0, std::ceil(std::log10(y1)));
  } else {
    double st = y_step(y1, 4);
    yhi = std::ceil(y1 / st) * st;
  }
  auto fy = [&](double v) {
    double t = log_y ? (std::log10(std::max(v, ylo)) - std::log10(ylo)) /
                           (std::log10(yhi) - std::log10(ylo))
                     : v / yhi;
    return b.y - float(t) * (b.y - a.y);
  };
  auto fx = [&](double v) { return a.x + float((v - x0) / (x1 - x0)) * (b.x - a.x); };

  // Y ticks and labels.
  std::vector<double> yt;
  if (log_y) {
    for (double v = ylo; v <= yhi * 1.0001; v *= 10) yt.push_back(v);
  } else {
    // About 4 ticks, fewer on a short plot so their labels do not touch.
    const int want = std::clamp(int((b.y - a.y) / (ImGui::GetTextLineHeight() * 1.6f)), 2, 4);
    double st = y_step(yhi, want);
    for (double v = 0; v <= yhi * 1.0001; v += st) yt.push_back(v);
  }
  for (double v : yt) {
    float y = fy(v);
    dl->AddLine(ImVec2(a.x, y), ImVec2(b.x, y), kGrid, 1.0f);
    std::string t = plot_value_label(v, spec.y_unit, spec.y_suffix);
    ImVec2 ts = ImGui::CalcTextSize(t.c_str());
    dl->AddText(ImVec2(a.x - ts.x - 4, y - ts.y * 0.5f), kText, t.c_str());
  }
  // X ticks, labels and the axis name.
  // As many x labels as fit with a gap of two digits between them (they crowded at 45 points).
  const float x_label_w = ImGui::CalcTextSize("00000").x + ImGui::CalcTextSize("00").x;
  const double xs = std::max(1.0, nice_step(x1 - x0, int(std::max(2.0f, (b.x - a.x) / x_label_w))));
  for (double v = std::ceil(x0 / xs) * xs; v <= x1 + 1e-9; v += xs) {
    float x = fx(v);
    dl->AddLine(ImVec2(x, b.y), ImVec2(x, b.y + 3), kText, 1.0f);
    char t[32];
    std::snprintf(t, sizeof t, "%.0f", v);
    ImVec2 ts = ImGui::CalcTextSize(t);
    dl->AddText(ImVec2(std::clamp(x - ts.x * 0.5f, a.x, b.x - ts.x), b.y + 3), kText, t);
  }
  ImVec2 xl = ImGui::CalcTextSize(spec.x_label);
  dl->AddText(ImVec2(p0.x + 2, b.y + 3), kText, spec.x_label);
  (void)xl;

  // Series.
  dl->PushClipRect(a, ImVec2(b.x + 1, b.y + 1), true);
  for (const PlotSeries& s : series) {
    if (!s.x || !s.y) continue;
    size_t n = std::min(s.x->size(), s.y->size());
    if (s.markers) {
      const size_t every = std::max<size_t>(1, (n + 23) / 24);
      for (size_t i = 0; i < n; ++i)
        if (i % every == every - 1 || i + 1 == n)
          dl->AddCircle(ImVec2(fx((*s.x)[i]), fy((*s.y)[i])), 3.5f, s.color, 10, s.thickness);
      continue;
    }
    if (n == 1) dl->AddCircleFilled(ImVec2(fx((*s.x)[0]), fy((*s.y)[0])), s.thickness + 1, s.color);
    for (size_t i = 1; i < n; ++i) {
      ImVec2 pa(fx((*s.x)[i - 1]), fy((*s.y)[i - 1])), pb(fx((*s.x)[i]), fy((*s.y)[i]));
      ImU32 col = s.colors && i < s.colors->size() ? (*s.colors)[i] : s.color;
      if (s.dashed)
        dashed_line(dl, pa, pb, col, s.thickness);
      else
        dl->AddLine(pa, pb, col, s.thickness);
    }
  }
  if (!std::isnan(spec.marker_x) && spec.marker_x >= x0 && spec.marker_x <= x1)
    dl->AddLine(ImVec2(fx(spec.marker_x), a.y), ImVec2(fx(spec.marker_x), b.y),
                IM_COL32(255, 210, 90, 200), 1.5f);
  dl->PopClipRect();

  // Hover: the values of every series at the nearest x.
  if (hovered) {
    double mx =
        x0 + double((ImGui::GetIO().MousePos.x - a.x) / std::max(b.x - a.x, 1.0f)) * (x1 - x0);
    ImGui::BeginTooltip();
    bool header = false;
    for (const PlotSeries& s : series) {
      if (!s.x || !s.y || s.x->empty()) continue;
      auto it = std::lower_bound(s.x->begin(), s.x->end(), mx);
      size_t i =
          size_t(std::min<std::ptrdiff_t>(it - s.x->begin(), std::ptrdiff_t(s.x->size()) - 1));
      if (i > 0 && std::abs((*s.x)[i - 1] - mx) < std::abs((*s.x)[i] - mx)) --i;
      if (!header) {
        ImGui::Text("%s %.0f", spec.x_label, (*s.x)[i]);
        header = true;
      }
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(s.color), "%s: %s", s.label.c_str(),
                         plot_value_label((*s.y)[i], spec.y_unit, spec.y_suffix).c_str());
    }
    ImGui::EndTooltip();
  }
}

}  // namespace kvscope::app
