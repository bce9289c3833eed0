// panel_inspector.cpp — a tooltip for the token under the mouse: text, id, attention,
// K/V norms at the selected layer.
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "app/scene_builder.h"
#include "app/ui_state.h"

namespace kvscope::app {

void panel_inspector(const UiState& ui, const Timeline& tl) {
  int pos = ui.hovered_pos;
  if (pos < 0 || pos >= int(tl.tokens().size())) return;
  const TokenInfo& t = tl.tokens()[size_t(pos)];
  ImGui::BeginTooltip();
  ImGui::Text("'%s'  id %d  position %d", display_text(t.text).c_str(), t.id, pos);
  ImGui::Text("%s", t.prompt ? "prompt token" : "generated token");
  if (!t.prompt) ImGui::Text("sampled at step %d", t.step);
  if (const StepTrace* last = tl.last(); last && pos < last->n_attn) {
    std::vector<float> w = beam_weights(*last, ui.view);
    ImGui::Text("attention from the head: %.4f", w[size_t(pos)]);
  }
  int layer = std::clamp(ui.view.layer, 0, std::max(tl.n_layer() - 1, 0));
  float k = tl.kv_norm(pos, layer, false), v = tl.kv_norm(pos, layer, true);
  if (std::isnan(k)) ImGui::TextDisabled("K/V not computed yet");
  else ImGui::Text("layer %d: |K| %.3f  |V| %.3f", layer, k, v);
  ImGui::EndTooltip();
}

}  // namespace kvscope::app
