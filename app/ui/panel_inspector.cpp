// panel_inspector.cpp — a tooltip for the token under the mouse: text, id, position, the
// attention it receives from the head (for the current layer/head choice), K/V norms, and the
// quantization error of its K/V rows where it was measured.
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "app/scene/scene_builder.h"
#include "app/scene/scene_kv.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

void panel_inspector(const UiState& ui, const Timeline& tl) {
  int pos = ui.hovered_pos;
  const TokenInfo* at = tl.token_at(pos);  // positions renumber after a context shift
  if (!at) return;
  const TokenInfo& t = *at;
  ImGui::BeginTooltip();
  ImGui::Text("'%s'", display_text(t.text).c_str());
  ImGui::Text("id %d   position %d   %s", t.id, pos, t.prompt ? "prompt token" : "generated");
  if (!t.prompt) ImGui::Text("sampled at step %d", t.step);
  const StepTrace* last = tl.viewed();
  int n_layer = std::max(tl.n_layer(), last ? last->n_layer : 0);
  if (last && pos < last->n_attn && !last->attention.empty()) {
    std::vector<float> w = beam_weights(*last, ui.view);
    ImGui::Text("attention received: %.4f", w[size_t(pos)]);
    ImGui::TextDisabled("from step %d (writing position %d, query at %d); %s", last->step,
                        last->pos, last->pos - 1, describe_view(ui.view, n_layer).c_str());
  } else {
    ImGui::TextDisabled("no attention to it yet (it is the newest token)");
  }
  int layer = resolved_layer(ui.view, n_layer);
  float k = tl.kv_norm(pos, layer, false), v = tl.kv_norm(pos, layer, true);
  if (std::isnan(k))
    ImGui::TextDisabled("K/V not computed yet");
  else
    ImGui::Text("layer %d: |K| %.3f  |V| %.3f", layer, k, v);
  // The quantization error of this stack's block in that layer, with the colour it has
  // (K's, or V's with "color by V") when the blocks are coloured by it.
  if (const std::string err = kv_error_text(tl, pos, layer); !err.empty()) {
    if (ui.view.color_by_error) {
      const glm::vec3 c = kv_error_color(tl.kv_error(pos, layer, ui.view.color_by_v));
      ImGui::ColorButton("##err", ImVec4(c.r, c.g, c.b, 1.0f), ImGuiColorEditFlags_NoTooltip,
                         ImVec2(ImGui::GetTextLineHeight(), ImGui::GetTextLineHeight()));
      ImGui::SameLine();
    }
    ImGui::TextUnformatted(err.c_str());
  } else if (ui.view.color_by_error) {
    ImGui::TextDisabled("quantization error not measured (grey block)");
  }
  ImGui::EndTooltip();
}

}  // namespace kvscope::app
