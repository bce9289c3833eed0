// panel_memory.cpp — the KV memory section: what this run's cache holds next to the
// formula for its settings (with and without the window, GQA against one KV head per query
// head), and the what-if table: the formula for this model and the reference shapes
// under the cache type, window and head-sharing chosen here, at a context length chosen
// here. Numbers from memory_whatif.h (the engine's formula). Draws content only, into the
// region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cstdio>

#include "app/core/memory_whatif.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

// A number with a bar under it: the bar's length is `frac` of the cell, and it runs below
// the text's line, so it never covers the digits.
void bar_cell(float frac, const std::string& text, ImU32 color) {
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float w = ImGui::GetContentRegionAvail().x, h = ImGui::GetTextLineHeight();
  const float y = p.y + h + 1.0f;
  ImGui::GetWindowDrawList()->AddRectFilled(
      ImVec2(p.x, y), ImVec2(p.x + std::max(w * std::clamp(frac, 0.0f, 1.0f), 2.0f), y + 3.0f),
      color);
  ImGui::TextUnformatted(text.c_str());
  ImGui::Dummy(ImVec2(1.0f, 2.0f));  // room for the bar below the line
}

void live_section(const UiState& ui, const Timeline& tl, const KvMemoryShape& shape) {
  const StepTrace* t = tl.viewed();  // the step the history slider shows
  if (!t) {
    ImGui::TextDisabled("no steps yet");
    return;
  }
  // Positions whose K/V went through the cache (the newest token's come with the next step).
  const int positions =
      t->mode == CacheMode::Cache ? t->kv_first_pos + t->kv_written : t->seq_len - 1;
  const LiveKv l = live_kv(shape, ui.run_kv, positions, t->kv_bytes);
  const ImVec4 accent(1.0f, 0.62f, 0.35f, 1.0f);
  if (t->mode == CacheMode::NoCache) {
    ImGui::TextColored(accent, "held      0 B (NO CACHE keeps nothing)");
    ImGui::Text("cached    %s for %d positions", format_bytes(l.formula).c_str(), l.positions);
  } else {
    ImGui::TextColored(accent, "held      %s for %d positions", format_bytes(l.held).c_str(),
                       l.positions);
    ImGui::Text("formula   %s", format_bytes(l.formula).c_str());
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "2 x %d layers x %d KV heads x %d dims x bytes per value (%s)\n"
          "x positions each layer holds, summed over layers",
          shape.n_layer, shape.n_head_kv, shape.head_dim, kv_types_name(ui.run_kv.types).c_str());
    if (ui.run_kv.block > 0) {
      ImGui::Text("in blocks %s%s", format_bytes(l.in_blocks).c_str(),
                  l.in_blocks == l.held ? "  (equal)" : "  (differs)");
      if (ImGui::IsItemHovered())
        ImGui::SetTooltip(
            "The same rows in the whole blocks of %d positions the cache takes from the\n"
            "KV pool: each layer's last block is partly used, and a windowed layer gives a\n"
            "block back only once no later query sees any of it.",
            ui.run_kv.block);
    }
  }
  if (l.without_window != l.formula)
    ImGui::Text("no window %s (%.1fx)", format_bytes(l.without_window).c_str(),
                l.formula ? double(l.without_window) / double(l.formula) : 0.0);
  ImGui::Text("per token %s", format_bytes(l.per_token).c_str());
  if (l.per_token_mha != l.per_token) {
    ImGui::Text("no GQA    %s per token (%.1fx)", format_bytes(l.per_token_mha).c_str(),
                l.per_token ? double(l.per_token_mha) / double(l.per_token) : 0.0);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "What each token would cost with one KV head per query head\n"
          "(%d KV heads instead of %d)",
          shape.n_head, shape.n_head_kv);
  }
}

void whatif_section(UiState& ui, const KvMemoryShape& shape) {
  WhatIfChoice& c = ui.whatif;
  ImGui::SetNextItemWidth(ImGui::GetFontSize() * 9.0f);
  ImGui::SliderInt("tokens", &ui.whatif_ctx, 1, 1 << 20, "%d", ImGuiSliderFlags_Logarithmic);
  ui.whatif_ctx = std::clamp(ui.whatif_ctx, 1, 1 << 24);
  kv_type_combo("K", &c.types.k);
  ImGui::SameLine();
  kv_type_combo("V", &c.types.v);
  const bool has_model_window = std::any_of(shape.layer_window.begin(), shape.layer_window.end(),
                                            [](int w) { return w > 0; });
  if (has_model_window) ImGui::Checkbox("the model's own windows", &c.model_window);
  bool sw = c.window > 0;
  if (ImGui::Checkbox("sink + window", &sw)) c.window = sw ? std::max(ui.whatif_window, 1) : 0;
  if (sw) {
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 4.0f);
    ImGui::InputInt("sink", &c.sink, 0);
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 5.0f);
    ImGui::InputInt("window", &c.window, 0);
    c.sink = std::max(c.sink, 0);
    c.window = std::max(c.window, 1);
    ui.whatif_window = c.window;
  }
  ImGui::Checkbox("one KV head per query head", &c.one_kv_head_per_query_head);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("What the cache would hold without grouped-query attention");

  const std::vector<WhatIfRow> models = whatif_models(shape, c, ui.whatif_ctx);
  uint64_t top = 1;
  for (const WhatIfRow& r : models) top = std::max(top, r.at_ctx);
  if (ImGui::BeginTable("##whatif_models", 3, ImGuiTableFlags_SizingStretchProp)) {
    ImGui::TableSetupColumn("model", ImGuiTableColumnFlags_WidthStretch, 2.2f);
    ImGui::TableSetupColumn("per token", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    ImGui::TableSetupColumn("all tokens", ImGuiTableColumnFlags_WidthStretch, 1.3f);
    ImGui::TableHeadersRow();
    for (size_t i = 0; i < models.size(); ++i) {
      const WhatIfRow& r = models[i];
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      // Names wrap: the column is narrow and the model's own name can be long.
      if (i == 0) ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.62f, 0.35f, 1.0f));
      ImGui::TextWrapped("%s", r.name.c_str());
      if (i == 0) ImGui::PopStyleColor();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(format_bytes(r.per_token).c_str());
      ImGui::TableNextColumn();
      bar_cell(float(double(r.at_ctx) / double(top)), format_bytes(r.at_ctx),
               IM_COL32(90, 140, 215, 230));
    }
    ImGui::EndTable();
  }
  ImGui::TextDisabled("this model by cache type (K and V alike)");
  const std::vector<WhatIfRow> types = whatif_types(shape, c, ui.whatif_ctx);
  top = 1;
  for (const WhatIfRow& r : types) top = std::max(top, r.at_ctx);
  if (ImGui::BeginTable("##whatif_types", 3, ImGuiTableFlags_SizingStretchProp)) {
    for (const WhatIfRow& r : types) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.name.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.per_token ? format_bytes(r.per_token).c_str() : "n/a");
      ImGui::TableNextColumn();
      bar_cell(float(double(r.at_ctx) / double(top)), r.per_token ? format_bytes(r.at_ctx) : "",
               IM_COL32(80, 190, 150, 230));
    }
    ImGui::EndTable();
  }
}

}  // namespace

void panel_memory(UiState& ui, const Timeline& tl) {
  const KvMemoryShape shape = facts_memory_shape(ui.facts);
  if (shape.n_layer <= 0) {
    ImGui::TextDisabled("no model loaded");
    return;
  }
  if (!ui.whatif_set) {  // the what-if starts from the run's own settings
    ui.whatif = ui.run_kv;
    ui.whatif_set = true;
  }
  ImGui::TextDisabled("This run");
  live_section(ui, tl, shape);
  ImGui::Separator();
  // The formula wraps at the column's width (the narrowest column cut it off).
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyle().Colors[ImGuiCol_TextDisabled]);
  ImGui::TextWrapped("What if: 2 x layers x KV heads x head dim x bytes x tokens");
  ImGui::PopStyleColor();
  whatif_section(ui, shape);
}

}  // namespace kvscope::app
