// panel_candidates.cpp — the top candidates of the viewed step (the newest unless the history
// slider chose another), the sampled one marked. Positions are numbered as everywhere: the
// step writes position `pos`, its query is the token at pos - 1.
// Draws content only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <cstdio>

#include "app/scene/scene_builder.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

void panel_candidates(const Timeline& tl) {
  const StepTrace* t = tl.viewed();
  if (!t || t->top.empty()) {
    ImGui::TextDisabled("no step yet");
  } else {
    ImGui::Text("step %d: candidates for position %d", t->step, t->pos);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "The model's query is the token at position %d; it predicts the token\n"
          "at position %d, drawn from these probabilities (after temperature).",
          t->pos - 1, t->pos);
    for (size_t i = 0; i < t->top.size(); ++i) {
      const Candidate& c = t->top[i];
      bool sampled = int(i) == t->sampled_rank;
      std::string label = display_text(c.text);
      if (sampled) ImGui::PushStyleColor(ImGuiCol_PlotHistogram, ImVec4(1.0f, 0.5f, 0.3f, 1.0f));
      char overlay[64];
      std::snprintf(overlay, sizeof overlay, "%.1f%%", 100.0 * c.p);
      ImGui::ProgressBar(c.p, ImVec2(120, 0), overlay);
      if (sampled) ImGui::PopStyleColor();
      ImGui::SameLine();
      ImGui::Text("'%s'%s", label.c_str(), sampled ? "  <- sampled" : "");
    }
  }
}

}  // namespace kvscope::app
