// panel_stats.cpp — COMPUTE, KV_CACHE, SEQ_LEN and timing, as defined in DESIGN.md.
// Draws content only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>

#include "app/ui_state.h"

namespace kvscope::app {

double observed_tokens_per_s(const UiState& ui) {
  const auto& a = ui.step_arrivals;
  if (a.size() < 2 || a.back() <= a.front()) return 0.0;
  return double(a.size() - 1) / (a.back() - a.front());
}

void panel_stats(const UiState& ui, const ControllerState& cs, const Timeline& tl) {
  ImGuiIO& io = ImGui::GetIO();
  const StepTrace* t = tl.last();
  ImVec4 accent(1.0f, 0.62f, 0.35f, 1.0f);
  bool nocache = tl.mode() == CacheMode::NoCache;
  ImGui::TextColored(accent, "MODE      %s", nocache ? "NO CACHE" : "KV CACHE");
  if (cs.busy)
    ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "          computing step %d... %.1f s",
                       cs.computing_step, cs.busy_seconds);
  if (t) {
    ImGui::TextColored(accent, "COMPUTE   %s FLOP this step", format_count(double(t->flops)).c_str());
    ImGui::Text("          %s FLOP total", format_count(double(t->flops_total)).c_str());
    ImGui::Text("          %llu K/V rows this step, %llu total",
                static_cast<unsigned long long>(t->kv_rows),
                static_cast<unsigned long long>(t->kv_rows_total));
    uint64_t per_tok = t->seq_len > 0 ? t->kv_bytes / uint64_t(t->seq_len) : 0;
    if (t->mode == CacheMode::Cache) {
      ImGui::TextColored(accent, "KV_CACHE  %s", format_bytes(t->kv_bytes).c_str());
      ImGui::Text("          %s per token", format_bytes(per_tok).c_str());
    } else {
      ImGui::TextColored(accent, "KV_CACHE  0 B held");
      ImGui::Text("          %s recomputed this step, discarded",
                  format_bytes(t->kv_transient_bytes).c_str());
    }
    ImGui::TextColored(accent, "SEQ_LEN   %d", t->seq_len);
    double ms = t->device_ms >= 0 ? t->device_ms : t->ms;
    ImGui::Text("step      %.1f ms%s, %d token(s) through the forward", ms,
                t->device_ms >= 0 ? " (GPU)" : "", t->tokens_processed);
    double observed = observed_tokens_per_s(ui);
    if (observed > 0)
      ImGui::Text("tokens/s  %.1f observed (engine alone %.1f)", observed,
                  t->ms > 0 ? 1000.0 / t->ms : 0.0);
    else
      ImGui::Text("tokens/s  %.1f (engine alone)", t->ms > 0 ? 1000.0 / t->ms : 0.0);
  } else {
    ImGui::TextDisabled("no steps yet: press Play or Step");
  }
  ImGui::Separator();
  ImGui::Text("model     %s", ui.facts.name.c_str());
  ImGui::Text("backend   %s", ui.facts.backend.c_str());
  ImGui::Text("KV dtype  %s (%s per token when cached)", ui.facts.kv_dtype.c_str(),
              format_bytes(ui.facts.kv_bytes_per_token).c_str());
  ImGui::Text("state     %s%s",
              cs.busy      ? "computing"
              : cs.playing ? "playing"
                           : "paused",
              cs.finished ? " (finished)" : "");
  ImGui::Text("frame     %.1f ms", 1000.0f / std::max(io.Framerate, 1.0f));
}

}  // namespace kvscope::app
