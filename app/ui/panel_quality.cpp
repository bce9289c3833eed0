// panel_quality.cpp — the Cache quality section: the engine's comparison run live
// (quality_job.h): a candidate cache (K and V types, sink + window) against the f16
// reference with the full context, on the selected prompt, in lockstep on the candidate's
// own tokens; KL per step plotted beside the bytes the candidate saves. Draws content
// only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "app/ui/ui_state.h"

namespace kvscope::app {
QualitySpec quality_spec(const UiState& ui, const PromptSpec& prompt) {
  QualitySpec spec;
  spec.candidate = ui.engine_options;
  spec.candidate.kv_types = ui.quality_kv.types;
  spec.candidate.limits = KvLimits{};
  spec.candidate.limits.sink = ui.quality_kv.window > 0 ? ui.quality_kv.sink : 0;
  spec.candidate.limits.window = ui.quality_kv.window;
  spec.prompt = prompt;
  spec.steps = ui.quality_steps;
  return spec;
}

void panel_quality(UiState& ui) {
  QualitySnapshot s = ui.quality->snapshot();
  ImGui::BeginDisabled(s.running);
  kv_type_combo("K##q", &ui.quality_kv.types.k);
  ImGui::SameLine();
  kv_type_combo("V##q", &ui.quality_kv.types.v);
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 3.0f);
  ImGui::InputInt("sink##q", &ui.quality_kv.sink, 0);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 3.5f);
  ImGui::InputInt("window##q", &ui.quality_kv.window, 0);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("0: no window (every position kept)");
  ui.quality_kv.sink = std::max(ui.quality_kv.sink, 0);
  ui.quality_kv.window = std::max(ui.quality_kv.window, 0);
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 6.0f);
  ImGui::SliderInt("steps##q", &ui.quality_steps, 4, 512, "%d", ImGuiSliderFlags_Logarithmic);
  const bool can = ui.engine_ready && !ui.prompts.empty();
  ImGui::SameLine();
  ImGui::BeginDisabled(!can);
  if (ImGui::Button("Compare")) {
    ui.quality->start(quality_spec(
        ui, ui.prompts[size_t(std::clamp(ui.prompt_index, 0, int(ui.prompts.size()) - 1))].spec));
    s = ui.quality->snapshot();
  }
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip(
        "Runs the selected prompt with this cache and, in lockstep on the same tokens,\n"
        "with an f16 cache over the full context (a second copy of the model, on its\n"
        "own thread; the run in the scene is not touched).");
  ImGui::EndDisabled();
  if (s.running) {
    ImGui::SameLine();
    if (ImGui::Button("Stop##q")) ui.quality->stop();
  }

  if (!s.error.empty()) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextColored(ImVec4(1.0f, 0.5f, 0.4f, 1.0f), "%s", s.error.c_str());
    ImGui::PopTextWrapPos();
  }
  if (s.points.empty()) {
    if (s.running) ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "opening the model...");
    return;
  }
  const QualityPoint& last = s.points.back();
  const int n = int(s.points.size());
  ImGui::PushTextWrapPos(0.0f);
  ImGui::Text("%s: step %d of %d%s", s.candidate.c_str(), last.step, s.steps,
              s.running ? " (running)" : "");
  ImGui::PopTextWrapPos();
  const double saved =
      last.ref_bytes ? 100.0 * (1.0 - double(last.cand_bytes) / double(last.ref_bytes)) : 0.0;
  std::vector<float> kl, sv;
  for (const QualityPoint& p : s.points) {
    kl.push_back(float(p.kl));
    sv.push_back(p.ref_bytes ? 100.0f * (1.0f - float(p.cand_bytes) / float(p.ref_bytes)) : 0);
  }
  // KL per step beside the bytes saved, on the same steps.
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  const float w = (ImGui::GetContentRegionAvail().x - gap) * 0.5f;
  const float h = ImGui::GetFontSize() * 4.0f;
  const float kl_max = std::max(*std::max_element(kl.begin(), kl.end()), 1e-6f);
  char cap[64];
  std::snprintf(cap, sizeof cap, "KL/step, max %.2g", kl_max);
  ImGui::PlotHistogram("##kl", kl.data(), n, 0, cap, 0.0f, kl_max * 1.15f, ImVec2(w, h));
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "KL per step (nats), one bar per step; higher bars: this cache\n"
        "changed the next-token distribution more");
  ImGui::SameLine(0.0f, gap);
  std::snprintf(cap, sizeof cap, "saved %.0f%%", saved);
  ImGui::PlotLines("##saved", sv.data(), n, 0, cap, 0.0f, 100.0f, ImVec2(w, h));
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("KV bytes this cache saves against the f16 reference, per step (0..100%%)");
  const ImVec4 accent(1.0f, 0.62f, 0.35f, 1.0f);
  ImGui::TextColored(accent, "mean KL   %.3g nats", s.mean_kl);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "KL(reference || this cache) of the next-token distributions,\n"
        "averaged over the steps so far (0: the same distribution)");
  ImGui::Text("top-1     same at %d of %d steps", s.agreements, n);
  ImGui::TextColored(accent, "KV held   %s (f16: %s)", format_bytes(last.cand_bytes).c_str(),
                     format_bytes(last.ref_bytes).c_str());
}

}  // namespace kvscope::app
