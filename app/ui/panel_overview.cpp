// panel_overview.cpp — the bottom strip: the whole sequence at a glance, however long.
//
// Every position gets a sliver of the strip's width (several positions share a pixel
// column past the strip's width in points; a column then shows the strongest of them).
// A band along the bottom says prompt (blue) or generated (orange); bars rising from it
// are the newest step's attention, with the beams' weights on the strip's own scale (the
// strongest targets marked with a white tick and a triangle, the sink in amber); a bracket
// marks the part the 3D view shows, a yellow tick the write head; positions the selected
// layer's cache has evicted are shaded up to its window boundary (amber; a sink's end
// green). Hover: the token's text and weight (and its block lights up in 3D). Click or
// drag: the camera goes to that part of the sequence.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "app/scene/overview_marks.h"
#include "app/scene/scene_builder.h"
#include "app/scene/scene_kv.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

void panel_overview(UiState& ui, const Timeline& tl, int shown_first, int shown_last) {
  // Every token (also those past a step looked at back in the history), or after a context
  // shift the viewed step's sequence (positions renumbered, dropped tokens gone).
  std::vector<TokenInfo> shifted_toks;
  if (tl.shifted())
    for (int p = 0; p < tl.viewed_seq_len(); ++p)
      if (const TokenInfo* t = tl.token_at(p)) shifted_toks.push_back(*t);
  const auto& toks = tl.shifted() ? shifted_toks : tl.tokens();
  const int n = int(toks.size());
  const StepTrace* last = tl.viewed();  // the step the history slider shows
  const int n_layer = std::max(tl.n_layer(), last ? last->n_layer : 0);

  char caption[200];
  if (last && last->n_attn > 0)
    std::snprintf(caption, sizeof caption, "Overview: %d tokens; bars = attention of step %d (%s)",
                  n, last->step, describe_view(ui.view, n_layer).c_str());
  else
    std::snprintf(caption, sizeof caption, "Overview: %d tokens", n);
  ImGui::TextDisabled("%s", caption);

  ImVec2 avail = ImGui::GetContentRegionAvail();
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImVec2 size(std::max(avail.x, 10.0f), std::max(avail.y, 12.0f));
  ImVec2 p1(p0.x + size.x, p0.y + size.y);
  ImGui::InvisibleButton("##overview", size);
  const bool hovered = ImGui::IsItemHovered();
  const bool active = ImGui::IsItemActive();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->AddRectFilled(p0, p1, IM_COL32(16, 18, 26, 255), 3.0f);
  if (n == 0) return;

  // Slots: every token plus the head's slot after the last one.
  const int slots = n + 1;
  const float x0 = p0.x + 2.0f, w = size.x - 4.0f;
  auto slot_x = [&](float pos) { return x0 + w * (pos + 0.5f) / float(slots); };
  auto pos_at = [&](float x) {
    return std::clamp(int(std::floor((x - x0) / w * float(slots))), 0, n - 1);
  };
  const float band_h = 4.0f, base_y = p1.y - band_h - 1.0f, bar_max = base_y - p0.y - 3.0f;

  // Prompt / generated band, drawn in runs.
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && toks[size_t(j)].prompt == toks[size_t(i)].prompt) ++j;
    ImU32 col = toks[size_t(i)].prompt ? IM_COL32(95, 120, 175, 255) : IM_COL32(230, 110, 70, 255);
    dl->AddRectFilled(ImVec2(x0 + w * float(i) / slots, base_y + 1.0f),
                      ImVec2(x0 + w * float(j) / slots, p1.y - 1.0f), col);
    i = j;
  }

  // Attention bars: one pixel column at a time, the strongest weight in it, on the strip's
  // own scale (overview_marks.h): the strongest target after the sink is full height, the
  // sink (when stronger) is amber, and the strongest few targets are marked from above.
  std::vector<float> weights;
  if (last && last->n_attn > 0) weights = beam_weights(*last, ui.view);
  if (!weights.empty()) {
    const int cols = std::max(1, int(w));
    const OverviewMarks m = overview_marks(weights, slots, cols);
    const float bar_w = std::clamp(w / float(slots) - 1.0f, 1.0f, 6.0f);
    for (int c = 0; c < cols; ++c) {
      const float v = m.height[size_t(c)];
      if (v < 0.03f) continue;
      const float x = x0 + float(c);
      const bool sink = c == m.sink_column;
      ImU32 col = sink ? IM_COL32(255, 190, 90, 255)
                       : ImGui::ColorConvertFloat4ToU32(
                             ImVec4(0.35f + 0.5f * v, 0.65f + 0.3f * v, 1.0f, 0.45f + 0.55f * v));
      dl->AddRectFilled(ImVec2(x, base_y - bar_max * v), ImVec2(x + bar_w, base_y), col);
    }
    for (size_t k = 0; k < m.top.size(); ++k) {
      const float x = x0 + float(m.top_column[k]) + 0.5f * bar_w;
      const float v = m.height[size_t(m.top_column[k])];
      const ImU32 mark = IM_COL32(240, 250, 255, 255);
      dl->AddRectFilled(ImVec2(x - 1.0f, base_y - bar_max * v), ImVec2(x + 1.0f, base_y), mark);
      dl->AddTriangleFilled(ImVec2(x - 4.0f, p0.y + 2.0f), ImVec2(x + 4.0f, p0.y + 2.0f),
                            ImVec2(x, p0.y + 7.0f), mark);
    }
  }

  // What the selected layer's cache no longer holds: shaded, with its window boundary (amber)
  // and the end of its sink (green).
  if (last) {
    const KvHoldings hold(last, previous_trace(tl));
    const int layer = resolved_layer(ui.view, n_layer);
    const int start = hold.window_start(layer), sink = hold.sink_end(layer);
    if (start > 0) {
      const float a = x0 + w * float(sink) / slots, b = x0 + w * float(start) / slots;
      dl->AddRectFilled(ImVec2(a, p0.y + 1), ImVec2(b, p1.y - 1), IM_COL32(0, 0, 0, 120));
      dl->AddLine(ImVec2(b, p0.y + 1), ImVec2(b, p1.y - 1), IM_COL32(255, 175, 45, 255), 2.0f);
      if (sink > 0)
        dl->AddLine(ImVec2(a, p0.y + 1), ImVec2(a, p1.y - 1), IM_COL32(90, 240, 115, 255), 2.0f);
    }
  }

  // The part of the sequence the 3D view shows.
  if (shown_first >= 0 && shown_last >= shown_first) {
    float a = x0 + w * float(shown_first) / slots, b = x0 + w * float(shown_last + 1) / slots;
    dl->AddRectFilled(ImVec2(a, p0.y + 1), ImVec2(b, p1.y - 1), IM_COL32(255, 255, 255, 18));
    dl->AddRect(ImVec2(a, p0.y + 1), ImVec2(b, p1.y - 1), IM_COL32(220, 225, 240, 120), 2.0f);
  }
  // The write head.
  float hx = slot_x(float(n));
  dl->AddTriangleFilled(ImVec2(hx - 4, p0.y + 1), ImVec2(hx + 4, p0.y + 1), ImVec2(hx, p0.y + 7),
                        IM_COL32(255, 215, 110, 255));
  dl->AddLine(ImVec2(hx, p0.y + 7), ImVec2(hx, p1.y - 1), IM_COL32(255, 215, 110, 160), 1.0f);
  // The token hovered anywhere.
  int hi = ui.hovered_pos >= 0 ? ui.hovered_pos : ui.panel_hovered_pos;
  if (hi >= 0 && hi < n)
    dl->AddLine(ImVec2(slot_x(float(hi)), p0.y + 1), ImVec2(slot_x(float(hi)), p1.y - 1),
                IM_COL32(255, 235, 140, 255), 2.0f);

  if (hovered || active) {
    int pos = pos_at(ImGui::GetIO().MousePos.x);
    ui.panel_hovered_pos = pos;
    if (active) ui.look_at_pos = pos;
    ImGui::BeginTooltip();
    ImGui::Text("position %d: '%s'%s", pos, display_text(toks[size_t(pos)].text).c_str(),
                toks[size_t(pos)].prompt ? " (prompt)" : "");
    if (pos < int(weights.size()))
      ImGui::Text("attention from the newest query: %.4f", weights[size_t(pos)]);
    ImGui::TextDisabled("click or drag: show this part in 3D");
    ImGui::EndTooltip();
  }
}

}  // namespace kvscope::app
