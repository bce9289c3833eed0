// panel_controls.cpp — the Controls section: prompt, pace, length, sampling, what the beams
// show. Draws content only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "app/ui_state.h"

namespace kvscope::app {

namespace {
void send(Controller* ctl, Command c) {
  if (ctl) ctl->send(std::move(c));
}
}  // namespace

void panel_controls(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl) {
  (void)tl;
  ImGui::BeginDisabled(!ui.engine_ready);

  // Prompt.
  ImGui::TextDisabled("Prompt");
  int n = int(ui.prompts.size());
  for (int i = 0; i < n; ++i) {
    if (i) ImGui::SameLine();
    if (ImGui::RadioButton(ui.prompts[size_t(i)].name.c_str(), ui.prompt_index == i)) {
      ui.prompt_index = i;
      send(ctl, CmdReset{ui.prompts[size_t(i)].spec, cs.playing});
    }
  }
  if (n > 0)
    ImGui::TextWrapped("%s",
                       ui.prompts[size_t(std::clamp(ui.prompt_index, 0, n - 1))].spec.text.c_str());

  // Pace and length (the transport buttons and the cache mode are in the toolbar).
  ImGui::Separator();
  ImGui::TextDisabled("Generation");
  if (ImGui::Checkbox("as fast as possible", &ui.speed_max))
    send(ctl, CmdSpeed{ui.speed_max ? kSpeedMax : ui.speed});
  ImGui::BeginDisabled(ui.speed_max);
  if (ImGui::SliderFloat("tok/s", &ui.speed, kSpeedMin, kSpeedTop, "%.2f",
                         ImGuiSliderFlags_Logarithmic))
    send(ctl, CmdSpeed{ui.speed});
  ImGui::EndDisabled();
  if (ImGui::SliderInt("max tokens", &ui.max_tokens, 1, 4096))
    send(ctl, CmdMaxTokens{ui.max_tokens});

  if (ImGui::TreeNode("Sampling")) {
    bool s = ImGui::SliderFloat("temperature", &ui.sampler.temperature, 0.0f, 2.0f, "%.2f");
    s |= ImGui::SliderInt("top-k", &ui.sampler.top_k, 0, 200);
    s |= ImGui::SliderFloat("top-p", &ui.sampler.top_p, 0.05f, 1.0f, "%.2f");
    int seed = int(ui.sampler.seed);
    if (ImGui::InputInt("seed", &seed)) {
      ui.sampler.seed = uint64_t(std::max(seed, 0));
      s = true;
    }
    if (s) send(ctl, CmdSampler{ui.sampler});
    ImGui::TextDisabled(ui.sampler.temperature <= 0 ? "greedy (temperature 0)" : "sampling");
    ImGui::TreePop();
  }
  ImGui::EndDisabled();

  // What the beams show.
  ImGui::Separator();
  ImGui::TextDisabled("Attention beams");
  int L = std::max(ui.facts.n_layer, 1), H = std::max(ui.facts.n_head, 1);
  ImGui::Checkbox("all layers (mean)", &ui.view.all_layers);
  ImGui::BeginDisabled(ui.view.all_layers);
  if (ui.view.layer == kMiddleLayer) ui.view.layer = L / 2;
  ImGui::SliderInt("layer", &ui.view.layer, 0, L - 1);
  ImGui::EndDisabled();
  const char* aggs[] = {"single head", "mean over heads", "max over heads"};
  int agg = int(ui.view.aggregation);
  if (ImGui::Combo("heads", &agg, aggs, 3)) ui.view.aggregation = HeadAggregation(agg);
  ImGui::BeginDisabled(ui.view.aggregation != HeadAggregation::Single);
  ImGui::SliderInt("head", &ui.view.head, 0, H - 1);
  ImGui::EndDisabled();
  ImGui::Checkbox("renormalize without the sink (pos 0)", &ui.view.renormalize_sink);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Position 0 usually takes most of the attention (an attention sink).\n"
        "On: drop it and rescale the rest to sum 1. Off: the real weights.");
  ImGui::Checkbox("color KV blocks by V norm", &ui.view.color_by_v);
  ImGui::Checkbox("token labels", &ui.view.labels);
}

}  // namespace kvscope::app
