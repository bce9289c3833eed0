// panel_stats.cpp — COMPUTE, KV_CACHE, SEQ_LEN and timing, as defined in DESIGN.md.
#include <imgui.h>

#include <algorithm>

#include "app/ui_state.h"

namespace kvscope::app {

void panel_stats(const UiState& ui, const ControllerState& cs, const Timeline& tl) {
  ImGuiIO& io = ImGui::GetIO();
  ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x - 330, 10), ImGuiCond_FirstUseEver);
  ImGui::SetNextWindowSize(ImVec2(340, 290), ImGuiCond_FirstUseEver);
  ImGui::Begin("Stats");
  const StepTrace* t = tl.last();
  ImVec4 accent(1.0f, 0.62f, 0.35f, 1.0f);
  ImGui::TextColored(accent, "MODE      %s", tl.mode() == CacheMode::Cache ? "KV CACHE" : "NO CACHE");
  if (t) {
    ImGui::TextColored(accent, "COMPUTE   %s FLOP this step", format_count(double(t->flops)).c_str());
    ImGui::Text("          %s FLOP total", format_count(double(t->flops_total)).c_str());
    ImGui::Text("          %llu K/V rows this step (%llu total)",
                static_cast<unsigned long long>(t->kv_rows), static_cast<unsigned long long>(t->kv_rows_total));
    ImGui::TextColored(accent, "KV_CACHE  %s", format_bytes(t->kv_bytes).c_str());
    if (t->kv_transient_bytes)
      ImGui::Text("          %s recomputed + discarded", format_bytes(t->kv_transient_bytes).c_str());
    ImGui::TextColored(accent, "SEQ_LEN   %d", t->seq_len);
    ImGui::Text("step      %.1f ms%s  (%.1f tok/s)", t->device_ms >= 0 ? t->device_ms : t->ms,
                t->device_ms >= 0 ? " (GPU)" : "", t->ms > 0 ? 1000.0 / t->ms : 0.0);
    ImGui::Text("tokens    %d through the forward", t->tokens_processed);
  } else {
    ImGui::TextDisabled("no steps yet: press Play or Step");
  }
  ImGui::Separator();
  ImGui::Text("model     %s", ui.facts.name.c_str());
  ImGui::Text("backend   %s", ui.facts.backend.c_str());
  ImGui::Text("KV dtype  %s (%s per token)", ui.facts.kv_dtype.c_str(),
              format_bytes(ui.facts.kv_bytes_per_token).c_str());
  ImGui::Text("state     %s%s", cs.busy ? "computing" : cs.playing ? "playing" : "paused",
              cs.finished ? " (finished)" : "");
  ImGui::Text("frame     %.1f ms", 1000.0f / std::max(io.Framerate, 1.0f));
  ImGui::End();
}

}  // namespace kvscope::app
