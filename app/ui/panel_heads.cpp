// panel_heads.cpp — the Heads section: which query heads share which KV head (grouped-query
// attention; multi-query when there is one KV head), drawn as a small graph. Clicking a
// query head shows its beams alone and lights the KV head it reads, here and in the 3D
// view; clicking it again goes back to the mean over heads. Draws content only, into the
// region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cstdio>

#include "app/scene/scene_kv.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

void panel_heads(UiState& ui) {
  const int H = ui.facts.n_head, Hkv = ui.facts.n_head_kv;
  if (H <= 0 || Hkv <= 0 || H % Hkv != 0) {
    ImGui::TextDisabled("no model loaded");
    return;
  }
  const int group = H / Hkv;
  if (Hkv == 1)
    ImGui::TextWrapped("%d query heads share 1 KV head (multi-query attention)", H);
  else if (Hkv == H)
    ImGui::TextWrapped("%d query heads, each with its own KV head", H);
  else
    ImGui::TextWrapped("%d query heads share %d KV heads, %d each (grouped-query attention)", H,
                       Hkv, group);

  const bool single = ui.view.aggregation == HeadAggregation::Single;
  const int sel = single ? std::clamp(ui.view.head, 0, H - 1) : -1;
  const int lit = sel >= 0 ? kv_head_of(sel, H, Hkv) : -1;

  // The graph: query heads on top, KV heads below, a line from each query head to its KV head.
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float w = ImGui::GetContentRegionAvail().x, fs = ImGui::GetFontSize();
  const float r = std::clamp(w / float(H) * 0.32f, 4.0f, fs * 0.6f);
  const float row_q = fs * 0.8f, row_kv = fs * 3.2f, box_h = fs * 1.2f;
  const ImVec2 o = ImGui::GetCursorScreenPos();
  auto qx = [&](int h) { return o.x + w * (float(h) + 0.5f) / float(H); };
  auto kx = [&](int g) { return o.x + w * (float(g) + 0.5f) / float(Hkv); };
  const ImU32 lit_col = IM_COL32(255, 235, 140, 255), dim = IM_COL32(110, 125, 150, 255);
  const ImU32 q_col = IM_COL32(120, 200, 255, 255);
  for (int h = 0; h < H; ++h) {
    const int g = h / group;
    dl->AddLine(ImVec2(qx(h), o.y + row_q + r), ImVec2(kx(g), o.y + row_kv),
                g == lit ? lit_col : dim, g == lit ? 2.0f : 1.0f);
  }
  int clicked = -1;
  for (int h = 0; h < H; ++h) {
    const ImVec2 c(qx(h), o.y + row_q);
    const bool is_sel = h == sel;
    dl->AddCircleFilled(c, r, is_sel ? lit_col : (lit >= 0 && h / group == lit ? q_col : dim));
    ImGui::SetCursorScreenPos(ImVec2(c.x - r, c.y - r));
    ImGui::PushID(h);
    if (ImGui::InvisibleButton("##q", ImVec2(2 * r, 2 * r))) clicked = h;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("query head %d reads KV head %d%s", h, h / group,
                        is_sel ? " (click: mean over heads again)" : " (click: show it alone)");
    ImGui::PopID();
  }
  const float box_w = std::min(w / float(Hkv) * 0.8f, fs * 5.0f);
  for (int g = 0; g < Hkv; ++g) {
    const ImVec2 a(kx(g) - 0.5f * box_w, o.y + row_kv),
        b(kx(g) + 0.5f * box_w, o.y + row_kv + box_h);
    dl->AddRectFilled(a, b, g == lit ? IM_COL32(120, 105, 40, 255) : IM_COL32(35, 60, 80, 255),
                      3.0f);
    dl->AddRect(a, b, g == lit ? lit_col : dim, 3.0f);
    char label[16];
    std::snprintf(label, sizeof label, "KV %d", g);
    const ImVec2 ts = ImGui::CalcTextSize(label);
    if (ts.x < box_w)
      dl->AddText(ImVec2(kx(g) - 0.5f * ts.x, a.y + 0.5f * (box_h - ts.y)),
                  g == lit ? lit_col : IM_COL32(200, 210, 225, 255), label);
  }
  ImGui::SetCursorScreenPos(ImVec2(o.x, o.y + row_kv + box_h + fs * 0.4f));
  ImGui::Dummy(ImVec2(w, 1.0f));
  if (clicked >= 0) {
    if (clicked == sel) {
      ui.view.aggregation = HeadAggregation::Mean;
    } else {
      ui.view.aggregation = HeadAggregation::Single;
      ui.view.head = clicked;
    }
  }
  if (sel >= 0) {
    ImGui::TextWrapped("query head %d reads KV head %d, lit in the scene", sel, lit);
  } else {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyle().Colors[ImGuiCol_TextDisabled]);
    ImGui::TextWrapped("click a query head to light the KV head it reads");
    ImGui::PopStyleColor();
  }
}

}  // namespace kvscope::app
