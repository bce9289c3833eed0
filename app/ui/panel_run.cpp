// panel_run.cpp — the Run section: which model (or recording) runs, the history slider that
// looks at any earlier step, and the files: save the run, play a recording, export the stats.
// Draws content only, into the region the layout gives it (see app_frame.cpp).
//
// The model picker stays usable whatever happened before: a model that failed to load leaves
// the last one running (or none), and another model or a built-in one can be opened at once.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "engine/bootstrap/bootstrap.h"
#include "app/core/model_choices.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

void send(Controller* ctl, Command c) {
  if (ctl) ctl->send(std::move(c));
}

// Opens `model` (a built-in name or a path) with the current mode and token limit.
void open_model(UiState& ui, Controller* ctl, const std::string& model) {
  ui.engine_options.model_path = model;
  ui.engine_options.mode = ui.mode;
  ui.engine_options.max_tokens = ui.max_tokens;
  send(ctl, CmdLoadModel{ui.engine_options});
}

void source_section(UiState& ui, Controller* ctl, const ControllerState& cs) {
  if (!ui.engine_ready)
    ImGui::TextColored(ImVec4(1.0f, 0.7f, 0.3f, 1.0f), "no model loaded: pick one below");
  else if (ui.replay)
    ImGui::TextWrapped(
        "Recording %s (made with %s, %s)", std::filesystem::path(ui.replay_path).filename().c_str(),
        model_display_name(ui.facts.name, ui.facts.file_name).c_str(), ui.facts.file_name.c_str());
  else
    ImGui::TextWrapped("Model %s (%s, %s backend)",
                       model_display_name(ui.facts.name, ui.facts.file_name).c_str(),
                       ui.facts.file_name.c_str(), ui.facts.backend.c_str());
  if (cs.loading) ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "opening...");

  ImGui::BeginDisabled(cs.loading);
  // Built-in models by name, then every other GGUF file under assets/models/ (looked for
  // again every few seconds, so a file copied there shows up), then any file by path.
  const double now = ImGui::GetTime();
  if (ui.model_list_time < 0 || now - ui.model_list_time > 3.0) {
    ui.model_list = model_choices(asset_model_dirs());
    ui.model_list_time = now;
  }
  for (const ModelChoice& c : ui.model_list) {
    std::string file = c.label;
    for (const BuiltinModel& m : builtin_models())
      if (c.builtin && c.label == m.name) file = m.file;
    const bool current = ui.engine_ready && !ui.replay && file == ui.facts.file_name;
    ImGui::PushID(c.open.c_str());
    ImGui::BeginDisabled(!c.present);
    const std::string label = c.builtin ? c.label + "  (built-in)" : c.label;
    if (ImGui::Selectable(label.c_str(), current) && !current) {
      ui.model_choice = c.open;
      open_model(ui, ctl, c.open);
    }
    ImGui::EndDisabled();
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip(c.present ? "Open %s (reloads on the engine's thread)"
                                  : "%s is not fetched yet: run scripts/fetch_model.sh",
                        file.c_str());
    ImGui::PopID();
  }
  ImGui::SetNextItemWidth(-70.0f);
  bool enter = ImGui::InputTextWithHint("##model", "a .gguf file", &ui.model_choice,
                                        ImGuiInputTextFlags_EnterReturnsTrue);
  ImGui::SameLine();
  if ((ImGui::Button("Open##model") || enter) && !ui.model_choice.empty())
    open_model(ui, ctl, ui.model_choice);
  ImGui::EndDisabled();
}

// The KV cache the model runs with: K and V element types, context size and what a full
// context does (stop, or shift keeping n_keep), sink + window, and what a model's own
// sliding-window layers keep (Gemma 3). Applying reopens the model with them (on the
// engine's thread, as a model switch does); the engine checks the values.
void cache_section(UiState& ui, Controller* ctl, const ControllerState& cs) {
  if (!ui.cache_edit_set) {
    ui.cache_edit = ui.engine_options;
    ui.cache_edit_set = true;
  }
  EngineOptions& e = ui.cache_edit;
  const float em = ImGui::GetFontSize();
  ImGui::BeginDisabled(cs.loading || ui.replay);
  kv_type_combo("K##run", &e.kv_types.k);
  ImGui::SameLine();
  kv_type_combo("V##run", &e.kv_types.v);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(em * 4.0f);
  ImGui::InputInt("ctx##run", &e.limits.n_ctx, 0);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Context size in positions (0: the model's own, %d)", ui.facts.n_ctx);

  // When the context is full: stop, or shift (llama.cpp's context shift).
  int full = e.limits.on_full == ContextPolicy::Shift ? 1 : 0;
  ImGui::SetNextItemWidth(em * 4.5f);
  if (ImGui::Combo("full##run", &full, "stop\0shift\0"))
    e.limits.on_full = full ? ContextPolicy::Shift : ContextPolicy::Stop;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "When the sequence reaches the context size: stop, or shift (keep the first\n"
        "n_keep positions, drop the oldest half of the rest, re-rotate the surviving\n"
        "K rows to their new positions); the scene animates each shift");
  if (full) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(em * 3.0f);
    ImGui::InputInt("keep##run", &e.limits.n_keep, 0);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("n_keep: positions a shift never drops");
  }
  ImGui::SetNextItemWidth(em * 3.0f);
  ImGui::InputInt("sink##run", &e.limits.sink, 0);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(em * 3.5f);
  ImGui::InputInt("window##run", &e.limits.window, 0);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Keep the first `sink` positions and the last `window` in every layer\n"
        "(StreamingLLM); 0: off");
  const auto& lw = ui.facts.layer_window;
  if (std::any_of(lw.begin(), lw.end(), [](int w) { return w > 0; })) {  // Gemma 3's local layers
    int keep_all = e.kv_policy == KvPolicy::Full ? 1 : 0;
    ImGui::SetNextItemWidth(em * 5.0f);
    if (ImGui::Combo("local layers keep##run", &keep_all, "window\0full\0"))
      e.kv_policy = keep_all ? KvPolicy::Full : KvPolicy::ModelWindow;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "What the model's sliding-window layers keep: their window (evicting older\n"
          "positions) or every position (attention still sees only the window)");
  }
  e.limits.n_ctx = std::max(e.limits.n_ctx, 0);
  e.limits.n_keep = std::max(e.limits.n_keep, 0);
  e.limits.sink = std::max(e.limits.sink, 0);
  e.limits.window = std::max(e.limits.window, 0);
  if (e.limits.window == 0) e.limits.sink = 0;
  if (e.limits.on_full == ContextPolicy::Stop) e.limits.n_keep = 0;
  const bool changed = kv_cache_differs(e, ui.engine_options);
  ImGui::SameLine();
  ImGui::BeginDisabled(!changed);
  if (ImGui::Button("Apply##cache")) {
    ui.engine_options = with_kv_cache_of(ui.engine_options, e);
    open_model(ui, ctl, ui.engine_options.model_path);
  }
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip("Reopen the model with this cache (the engine checks the values)");
  ImGui::EndDisabled();
}

void history_section(UiState& ui, const Timeline& tl) {
  const int n = tl.step_count();
  if (n == 0) {
    ImGui::TextDisabled("no steps yet");
    return;
  }
  int k = tl.viewed_step();
  ImGui::SetNextItemWidth(-70.0f);
  if (ImGui::SliderInt("##step", &k, 1, n, "step %d")) ui.scrub_request = k;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Look at any earlier step: its beams, candidates and stats.\n"
        "Left/Right with the slider active move one step.");
  if (ImGui::IsItemActive() || ImGui::IsItemFocused()) {
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow)))
      ui.scrub_request = std::max(1, k - 1);
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow)))
      ui.scrub_request = std::min(n, k + 1);
  }
  ImGui::SameLine();
  ImGui::BeginDisabled(tl.live());
  if (ImGui::Button("Live")) ui.scrub_request = -1;
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Follow the newest step again");
  if (tl.live()) {
    ImGui::TextDisabled("following the newest step (%d)", n);
  } else {
    ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "looking at step %d of %d", k, n);
    if (!tl.viewed_note().empty()) ImGui::TextWrapped("%s", tl.viewed_note().c_str());
  }
}

void files_section(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl) {
  ImGui::SetNextItemWidth(-70.0f);
  ImGui::InputTextWithHint("##run", "run file (.kvs)", &ui.run_path);
  ImGui::SameLine();
  ImGui::BeginDisabled(tl.step_count() == 0 || ui.run_path.empty());
  if (ImGui::Button("Save")) open_save_dialog(ui, SaveKind::Run, tl);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Write this run (prompt, settings, model identity, every step) to a\n"
        "file (%s now); play it back later with kvscope --replay FILE.",
        format_bytes(cs.save_bytes).c_str());
  ImGui::EndDisabled();
  ImGui::BeginDisabled(cs.loading || ui.run_path.empty());
  if (ImGui::Button("Play recording")) send(ctl, CmdOpenRun{ui.run_path});
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Open the run file above and play it back, without the model");
  ImGui::EndDisabled();
  if (ui.replay) {
    ImGui::SameLine();
    ImGui::BeginDisabled(cs.loading);
    if (ImGui::Button("Back to the model")) open_model(ui, ctl, ui.engine_options.model_path);
    ImGui::EndDisabled();
  }
  ImGui::SetNextItemWidth(-70.0f);
  ImGui::InputTextWithHint("##csv", "stats file (.csv)", &ui.csv_path);
  ImGui::SameLine();
  ImGui::BeginDisabled(tl.step_count() == 0 || ui.csv_path.empty());
  if (ImGui::Button("Export")) open_save_dialog(ui, SaveKind::Stats, tl);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Every step's numbers as CSV");
  ImGui::EndDisabled();
}

}  // namespace

void panel_run(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl) {
  ImGui::TextDisabled("Source");
  source_section(ui, ctl, cs);
  ImGui::Separator();
  ImGui::TextDisabled("KV cache");
  cache_section(ui, ctl, cs);
  ImGui::Separator();
  ImGui::TextDisabled("History");
  history_section(ui, tl);
  ImGui::Separator();
  ImGui::TextDisabled("Files");
  files_section(ui, ctl, cs, tl);
  // The notices that faded from the view, newest first.
  if (!ui.notice_log.empty()) {
    ImGui::Separator();
    char label[48];
    std::snprintf(label, sizeof label, "Messages (%zu)###messages", ui.notice_log.size());
    if (ImGui::TreeNode(label)) {
      for (auto it = ui.notice_log.rbegin(); it != ui.notice_log.rend(); ++it)
        ImGui::TextWrapped("%s", it->c_str());
      ImGui::TreePop();
    }
  }
}

}  // namespace kvscope::app
