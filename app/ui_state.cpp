// ui_state.cpp — FLOP estimate for the other mode's curve and number formatting.
#include "app/ui_state.h"

#include <cstdio>

#include <imgui.h>

namespace kvscope::app {

uint64_t estimate_step_flops(const ModelFacts& m, CacheMode mode, int past, int n_new) {
  if (n_new <= 0) return 0;
  uint64_t per_tok = 2 * m.block_macs_per_token;
  uint64_t lm_head = 2ull * uint64_t(m.n_embd) * uint64_t(m.n_vocab);
  uint64_t attn_unit = 4ull * uint64_t(m.n_head) * uint64_t(m.head_dim) * uint64_t(m.n_layer);
  auto attention = [&](uint64_t first_keys, uint64_t count) {  // sum of keys over queries
    return attn_unit * (count * first_keys + count * (count - 1) / 2);
  };
  if (mode == CacheMode::Cache)
    return uint64_t(n_new) * per_tok + lm_head + attention(uint64_t(past) + 1, uint64_t(n_new));
  uint64_t T = uint64_t(past) + uint64_t(n_new);
  return T * per_tok + lm_head + attention(1, T);
}

std::string format_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string format_count(double v) {
  const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (v >= 1000.0 && u < 5) {
    v /= 1000.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f%s" : "%.0f%s", v, units[u]);
  return buf;
}

void panel_error_modal(UiState& ui) {
  if (ui.error.empty()) return;
  ImGui::OpenPopup("kvscope error");
  ImVec2 center = ImGui::GetMainViewport()->GetCenter();
  ImGui::SetNextWindowPos(center, ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSize(ImVec2(560, 0), ImGuiCond_Appearing);
  if (ImGui::BeginPopupModal("kvscope error", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
    ImGui::PushTextWrapPos(540);
    ImGui::TextUnformatted(ui.error.c_str());
    ImGui::PopTextWrapPos();
    ImGui::Separator();
    if (ImGui::Button("OK", ImVec2(120, 0))) {
      ui.error.clear();
      ImGui::CloseCurrentPopup();
    }
    ImGui::EndPopup();
  }
}

}  // namespace kvscope::app
