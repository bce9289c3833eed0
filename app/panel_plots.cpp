// panel_plots.cpp — COMPUTE per step (measured) with the other mode's estimate overlaid,
// and KV cache bytes over the run.
#include <imgui.h>

#include <algorithm>
#include <vector>

#include "app/ui_state.h"

namespace kvscope::app {
namespace {

// Two series on a shared y axis in one framed box.
void plot_two(const char* id, const std::vector<float>& a, ImU32 col_a, const std::vector<float>& b,
              ImU32 col_b, ImVec2 size) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImVec2 p1(p0.x + size.x, p0.y + size.y);
  ImGui::InvisibleButton(id, size);
  dl->AddRectFilled(p0, p1, IM_COL32(20, 22, 30, 255), 3.0f);
  float mx = 1e-9f;
  for (float v : a) mx = std::max(mx, v);
  for (float v : b) mx = std::max(mx, v);
  size_t n = std::max(a.size(), b.size());
  if (n < 2) return;
  auto draw = [&](const std::vector<float>& s, ImU32 col) {
    std::vector<ImVec2> pts;
    for (size_t i = 0; i < s.size(); ++i)
      pts.emplace_back(p0.x + 4 + (size.x - 8) * float(i) / float(n - 1),
                       p1.y - 4 - (size.y - 8) * s[i] / mx);
    if (pts.size() >= 2) dl->AddPolyline(pts.data(), int(pts.size()), col, 0, 2.0f);
  };
  draw(b, col_b);
  draw(a, col_a);
  dl->AddText(ImVec2(p0.x + 6, p0.y + 4), IM_COL32(180, 180, 190, 255), format_count(mx).c_str());
}

}  // namespace

void panel_plots(const UiState& ui, const Timeline& tl) {
  ImGuiIO& io = ImGui::GetIO();
  ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x - 430, io.DisplaySize.y - 330), ImGuiCond_FirstUseEver);
  ImGui::SetNextWindowSize(ImVec2(420, 320), ImGuiCond_FirstUseEver);
  ImGui::Begin("Plots");
  std::vector<float> measured, other, kv;
  for (const auto& sp : tl.steps()) {
    const StepTrace& t = *sp;
    measured.push_back(float(t.flops));
    int past = std::max(0, t.seq_len - 1 - t.tokens_processed);
    if (t.mode == CacheMode::Cache) {
      other.push_back(float(estimate_step_flops(ui.facts, CacheMode::NoCache, 0, t.seq_len - 1)));
    } else {
      // What CACHE mode would have processed: the prompt on step 1, one token after.
      int n_new = t.step == 1 ? t.seq_len - 1 : 1;
      other.push_back(float(estimate_step_flops(ui.facts, CacheMode::Cache, t.seq_len - 1 - n_new, n_new)));
    }
    (void)past;
    kv.push_back(float(t.kv_bytes + t.kv_transient_bytes));
  }
  ImU32 orange = IM_COL32(255, 140, 80, 255), blue = IM_COL32(110, 190, 255, 200);
  const char* other_name = tl.mode() == CacheMode::Cache ? "NO CACHE (estimate)" : "KV CACHE (estimate)";
  ImGui::TextColored(ImVec4(1.0f, 0.55f, 0.3f, 1.0f), "COMPUTE per step (measured)");
  ImGui::SameLine();
  ImGui::TextColored(ImVec4(0.43f, 0.75f, 1.0f, 1.0f), "vs %s", other_name);
  float w = ImGui::GetContentRegionAvail().x;
  plot_two("##flops", measured, orange, other, blue, ImVec2(w, 150));
  ImGui::Text("KV bytes (held + recomputed) per step");
  plot_two("##kv", kv, IM_COL32(120, 230, 190, 255), {}, 0, ImVec2(w, 90));
  ImGui::End();
}

}  // namespace kvscope::app
