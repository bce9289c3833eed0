// panel_toolbar.cpp — the toolbar along the top of the window: transport, cache mode,
// camera presets, PNG export, and the engine's status.
//
// Every button has a fixed width and a fixed place: nothing moves when a label, a prompt
// or a status changes length (Play and Pause share one slot). The status text sits to
// the right of the last button, shown only where it fits whole (the story strip under the
// view always has it). Tooltips hang below the toolbar, under their button, never over its
// neighbours. Keys (when no text field
// has the keyboard): Space play/pause, S or Right step, R reset, C KV CACHE / NO CACHE,
// 1-5 camera presets.
// (ImGui 1.86 indexes letter and digit keys by their GLFW key codes, which are ASCII.)
#include <imgui.h>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <string>

#include "app/core/stats_view.h"
#include "app/ui/panel_text.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

void send(Controller* ctl, Command c) {
  if (ctl) ctl->send(std::move(c));
}

const PromptSpec* selected_prompt(const UiState& ui) {
  if (ui.prompts.empty()) return nullptr;
  return &ui.prompts[size_t(std::clamp(ui.prompt_index, 0, int(ui.prompts.size()) - 1))].spec;
}

// A button that looks pressed while `active`.
bool toggle_button(const char* label, bool active, ImVec2 size) {
  if (active) {
    ImGui::PushStyleColor(ImGuiCol_Button, ImGui::GetStyle().Colors[ImGuiCol_ButtonActive]);
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 1.0f, 1.0f, 1.0f));
  }
  bool pressed = ImGui::Button(label, size);
  if (active) ImGui::PopStyleColor(2);
  return pressed;
}

// The hovered button's tooltip, hung below the toolbar under the button, so it never covers
// the buttons next to it (a tooltip at the pointer hides the neighbours one may reach for).
void button_tip(const char* fmt, ...) IM_FMTARGS(1);
void button_tip(const char* fmt, ...) {
  if (!ImGui::IsItemHovered()) return;
  char text[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  // Kept inside the window on the right (the status at the toolbar's end is wide).
  const float w = ImGui::CalcTextSize(text).x + ImGui::GetStyle().WindowPadding.x * 2.0f;
  const float right = ImGui::GetIO().DisplaySize.x - 4.0f;
  const float below = ImGui::GetWindowPos().y + ImGui::GetWindowHeight() + 4.0f;
  ImGui::SetNextWindowPos(
      ImVec2(std::max(0.0f, std::min(ImGui::GetItemRectMin().x, right - w)), below));
  ImGui::BeginTooltip();
  ImGui::TextUnformatted(text);
  ImGui::EndTooltip();
}

void gap() {
  ImGui::SameLine(0.0f, ImGui::GetStyle().ItemSpacing.x * 3.0f);
}

std::string run_status(const UiState& ui, const ControllerState& cs, const Timeline& tl) {
  char buf[160];
  if (cs.busy) {
    std::snprintf(buf, sizeof buf, "computing step %d... %.1f s%s", cs.computing_step,
                  cs.busy_seconds, tl.mode() == CacheMode::NoCache ? " (whole sequence)" : "");
    return buf;
  }
  if (cs.finished) {
    const StepTrace* last = tl.last();
    if (!last) return "ready: press Play or Step";
    std::string done = finished_text(tl);
    if (done.empty()) done = std::string("finished (") + stop_reason_name(last->stop) + ")";
    std::snprintf(buf, sizeof buf, "%s, %d tokens", done.c_str(), last->seq_len);
    return buf;
  }
  if (cs.playing) {
    if (cs.speed <= kSpeedMax) return "playing, as fast as possible";
    std::snprintf(buf, sizeof buf, "playing at %.2g tok/s", double(cs.speed));
    return buf;
  }
  return "paused";
}

// What the run is doing, then the mode chosen for the next step when it is not the one the
// last step ran in (the Stats panel says the same).
std::string status_text(const UiState& ui, const ControllerState& cs, const Timeline& tl) {
  if (!ui.engine_ready) return "no engine";
  std::string status = run_status(ui, cs, tl);
  if (const std::string pending = pending_mode_text(tl, ui.mode); !pending.empty())
    status += "; " + pending;
  return status;
}

}  // namespace

void panel_toolbar(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl) {
  const ImGuiStyle& st = ImGui::GetStyle();
  const float h = ImGui::GetFrameHeight();
  const float slot = ImGui::CalcTextSize("Pause").x + st.FramePadding.x * 4.0f;
  const PromptSpec* prompt = selected_prompt(ui);
  ImGuiIO& io = ImGui::GetIO();
  const bool keys = !io.WantTextInput && !ImGui::IsAnyItemActive();

  // Transport.
  ImGui::BeginDisabled(!ui.engine_ready);
  bool do_reset = ImGui::Button("Reset", ImVec2(slot, h)) || (keys && ImGui::IsKeyPressed('R'));
  button_tip("Start again from the prompt (R)");
  if (do_reset && prompt) send(ctl, CmdReset{*prompt, false});
  ImGui::SameLine();
  bool toggle = keys && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false);
  if (cs.playing) {
    if (ImGui::Button("Pause", ImVec2(slot, h)) || toggle) send(ctl, CmdPause{});
    button_tip("Pause after the step in flight (Space)");
  } else {
    if (ImGui::Button("Play", ImVec2(slot, h)) || toggle) {
      if (cs.finished && prompt)
        send(ctl, CmdReset{*prompt, true});
      else
        send(ctl, CmdPlay{});
    }
    button_tip("Generate at the chosen pace (Space)");
  }
  ImGui::SameLine();
  bool do_step = ImGui::Button("Step", ImVec2(slot, h)) ||
                 (keys && (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow)) ||
                           ImGui::IsKeyPressed('S')));
  button_tip("Generate one token (S or Right)");
  if (do_step) send(ctl, CmdStep{});
  ImGui::SameLine();
  if (ImGui::Button("Stop", ImVec2(slot, h))) send(ctl, CmdStop{});
  button_tip("End this run (Reset or Play starts a new one)");

  // Cache mode: the switch the whole product is about.
  gap();
  const float mode_w = ImGui::CalcTextSize("NO CACHE").x + st.FramePadding.x * 4.0f;
  CacheMode want = ui.mode;
  if (toggle_button("KV CACHE", ui.mode == CacheMode::Cache, ImVec2(mode_w, h)))
    want = CacheMode::Cache;
  button_tip("Keep every token's K and V: each step computes one new row per layer (C switches)");
  ImGui::SameLine(0.0f, 0.0f);
  if (toggle_button("NO CACHE", ui.mode == CacheMode::NoCache, ImVec2(mode_w, h)))
    want = CacheMode::NoCache;
  button_tip("Keep nothing: each step recomputes K and V for the whole sequence (C switches)");
  if (keys && ImGui::IsKeyPressed('C', false))
    want = ui.mode == CacheMode::Cache ? CacheMode::NoCache : CacheMode::Cache;
  if (want != ui.mode) {
    ui.mode = want;
    send(ctl, CmdMode{ui.mode});
  }
  ImGui::EndDisabled();

  // Camera presets.
  gap();
  const float cam_w = ImGui::CalcTextSize("FOLLOW").x + st.FramePadding.x * 2.0f;
  int key = 0;
  for (render::CameraPreset p : render::kAllCameraPresets) {
    if (key) ImGui::SameLine(0.0f, 2.0f);
    ++key;
    std::string label = render::camera_preset_name(p);
    for (char& c : label) c = char(std::toupper(static_cast<unsigned char>(c)));
    bool pressed = toggle_button(label.c_str(), ui.preset == p, ImVec2(cam_w, h));
    button_tip("Camera preset %s (key %d)", label.c_str(), key);
    if (pressed || (keys && ImGui::IsKeyPressed('0' + key, false))) {
      ui.preset = p;
      ui.preset_changed = true;
    }
  }

  gap();
  if (ImGui::Button("Export PNG", ImVec2(0, h))) open_save_dialog(ui, SaveKind::ViewPng, tl);
  button_tip("Save the 3D view as it is now to a PNG file (choose where first)");
  ImGui::SameLine();
  if (ImGui::Button("Serving", ImVec2(0, h))) ui.serving = true;
  button_tip("The Serving view: many requests at once from one pool of KV blocks (paged "
             "attention, continuous batching, prefix sharing, preemption)");

  // Status: to the right of the buttons, so it never pushes them.
  gap();
  std::string status = status_text(ui, cs, tl);
  if (cs.busy && cs.busy_seconds >= 0.15) {
    const char* spin = "|/-\\";
    status = std::string(1, spin[int(ImGui::GetTime() * 8.0) & 3]) + " " + status;
  }
  // Where the whole status does not fit (a narrow window), the toolbar leaves it to the
  // story strip under the view, which always shows it, and keeps only the spinner: no
  // status cut off in the middle of a word.
  const std::string full = status;
  if (ImGui::CalcTextSize(status.c_str()).x > ImGui::GetContentRegionAvail().x)
    status = cs.busy && cs.busy_seconds >= 0.15 ? status.substr(0, 1) : "";
  if (status.empty()) return;
  if (cs.busy && cs.busy_seconds >= 0.15)
    ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "%s", status.c_str());
  else
    ImGui::TextDisabled("%s", status.c_str());
  if (status != full) button_tip("%s", full.c_str());
}

}  // namespace kvscope::app
