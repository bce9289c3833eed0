// ui_state.cpp — number formatting and the error modal.
#include "app/ui/ui_state.h"

#include <cstdio>
#include <ctime>

#include <imgui.h>

namespace kvscope::app {

std::string format_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
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

KvMemoryShape facts_memory_shape(const ModelFacts& f) {
  const std::string name = model_display_name(f.name, f.file_name);
  return {name, f.n_layer, f.n_head, f.n_head_kv, f.head_dim, f.layer_window};
}

ViewOptions scene_options(const UiState& ui) {
  ViewOptions v = ui.view;
  v.n_head_kv = ui.facts.n_head_kv;
  v.kv_types = ui.facts.kv_types;
  return v;
}

void add_notice(UiState& ui, std::string text, double seconds) {
  if (text.empty()) return;
  for (const Notice& n : ui.notices)
    if (n.text == text) return;  // already shown
  char stamp[16] = "";
  const std::time_t now = std::time(nullptr);
  if (std::tm tm{}; localtime_r(&now, &tm)) std::strftime(stamp, sizeof stamp, "%H:%M:%S  ", &tm);
  ui.notice_log.push_back(stamp + text);
  while (ui.notice_log.size() > kNoticeLogSize) ui.notice_log.pop_front();
  Notice n;
  n.id = ui.next_notice_id++;
  n.text = std::move(text);
  n.seconds = seconds;
  ui.notices.push_back(std::move(n));
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

bool kv_type_combo(const char* label, KvDtype* t) {
  static const KvDtype kTypes[] = {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0};
  bool changed = false;
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 4.5f);
  if (ImGui::BeginCombo(label, kv_dtype_name(*t))) {
    for (KvDtype c : kTypes)
      if (ImGui::Selectable(kv_dtype_name(c), c == *t)) {
        changed = changed || c != *t;
        *t = c;
      }
    ImGui::EndCombo();
  }
  return changed;
}

}  // namespace kvscope::app
