// panel_save.cpp — the save dialog of Save (the run), Export (the stats as CSV) and Export
// PNG (the 3D view): a folder to choose (typed, or stepped into from its subfolders), a
// file name, and the size the file will take, said before anything is written (an
// 800-step run is about 190 MB). It warns when the file exists or is large, and refuses
// a folder that does not exist or a disk without room for it.
//
// Drawn with ImGui like the rest of the app (no system dialog: the app runs with no
// desktop portal, and a capture has no window at all). Its size line, the file it writes
// and its warnings are noted in ui.shown, for the tests.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "app/core/stats_csv.h"
#include "app/ui/app_capture.h"
#include "app/ui/panel_text.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace fs = std::filesystem;
namespace {

// Files at least this large are said in the warning colour.
constexpr uint64_t kLargeFile = 100ull << 20;
constexpr size_t kMaxListed = 1000;  // subfolders listed (a huge folder stays quick)

const char* kind_title(SaveKind k) {
  switch (k) {
    case SaveKind::Run:
      return "Save the run";
    case SaveKind::Stats:
      return "Export the stats";
    case SaveKind::ViewPng:
      return "Export the 3D view";
  }
  return "";
}

// The PNG's size in pixels: the view's rectangle at the framebuffer's scale.
std::pair<int, int> view_pixels(const UiState& ui) {
  const ImVec2 s = ImGui::GetIO().DisplayFramebufferScale;
  return {int(ui.layout.view.w * std::max(s.x, 1.0f)), int(ui.layout.view.h * std::max(s.y, 1.0f))};
}

void list_folder(SaveDialog& d) {
  if (d.listed == d.folder) return;
  d.listed = d.folder;
  d.subfolders.clear();
  std::error_code ec;
  for (fs::directory_iterator it(d.folder, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end && d.subfolders.size() < kMaxListed; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dec;
    if (!name.empty() && name[0] != '.' && it->is_directory(dec)) d.subfolders.push_back(name);
  }
  std::sort(d.subfolders.begin(), d.subfolders.end());
}

void enter_folder(SaveDialog& d, const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) abs = p;
  d.folder = abs.string();
  d.folder_box = d.folder;
}

// Why the dialog cannot write (empty: it can).
std::string save_problem(const SaveDialog& d, uint64_t bytes) {
  std::error_code ec;
  if (d.name.empty()) return "Type a file name.";
  if (d.name.find('/') != std::string::npos) return "The file name cannot hold a '/'.";
  if (!fs::is_directory(d.folder, ec)) return "The folder '" + d.folder + "' does not exist.";
  const fs::space_info sp = fs::space(d.folder, ec);
  if (!ec && sp.available < bytes)
    return "Not enough room: the disk has " + format_bytes(sp.available) + " free.";
  return "";
}

void folder_chooser(SaveDialog& d) {
  ImGui::TextDisabled("Folder");
  ImGui::SetNextItemWidth(-ImGui::CalcTextSize("Up").x - ImGui::GetStyle().FramePadding.x * 2 -
                          ImGui::GetStyle().ItemSpacing.x);
  if (ImGui::InputText("##folder", &d.folder_box, ImGuiInputTextFlags_EnterReturnsTrue))
    enter_folder(d, d.folder_box);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Type a folder and press Enter");
  ImGui::SameLine();
  if (ImGui::Button("Up")) enter_folder(d, fs::path(d.folder).parent_path());
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("The folder above this one");
  list_folder(d);
  const float line = ImGui::GetTextLineHeightWithSpacing();
  ImGui::BeginChild("##subfolders", ImVec2(0, line * 6.5f), true);
  if (d.subfolders.empty()) ImGui::TextDisabled("(no folders inside)");
  std::string into;
  for (const std::string& sub : d.subfolders)
    if (ImGui::Selectable((sub + "/").c_str())) into = sub;
  ImGui::EndChild();
  if (!into.empty()) enter_folder(d, fs::path(d.folder) / into);
}

}  // namespace

void open_save_dialog(UiState& ui, SaveKind kind, const Timeline& tl) {
  SaveDialog& d = ui.save;
  d.kind = kind;
  d.open_request = true;
  d.csv.clear();
  fs::path start;
  switch (kind) {
    case SaveKind::Run:
      start = ui.run_path;
      break;
    case SaveKind::Stats:
      start = ui.csv_path;
      break;
    case SaveKind::ViewPng:
      start = ui.export_png_path.empty() ? "." : ui.export_png_path;
      break;
  }
  enter_folder(d, start.has_parent_path() ? start.parent_path() : fs::path("."));
  d.name = start.filename().string();
  if (kind == SaveKind::ViewPng) {
    const std::string free = free_view_png_name(d.folder);
    d.name = free.empty() ? "kvscope-view.png" : free;
  }
  if (kind == SaveKind::Stats) {
    std::ostringstream out;
    write_stats_csv_header(out);
    for (const auto& t : tl.steps()) write_stats_csv_row(out, *t);
    d.csv = out.str();
  }
}

uint64_t save_dialog_bytes(const UiState& ui, const ControllerState& cs) {
  switch (ui.save.kind) {
    case SaveKind::Run:
      return cs.save_bytes;
    case SaveKind::Stats:
      return ui.save.csv.size();
    case SaveKind::ViewPng: {
      auto [w, h] = view_pixels(ui);
      return uint64_t(std::max(w, 0)) * uint64_t(std::max(h, 0)) * 4u;
    }
  }
  return 0;
}

bool save_dialog_confirm(UiState& ui, Controller* ctl, const ControllerState& cs,
                         const Timeline& tl) {
  SaveDialog& d = ui.save;
  if (std::string why = save_problem(d, save_dialog_bytes(ui, cs)); !why.empty()) {
    ui.error = why;
    return false;
  }
  const std::string path = (fs::path(d.folder) / d.name).string();
  switch (d.kind) {
    case SaveKind::Run:
      ui.run_path = path;
      if (ctl) ctl->send(CmdSave{path, tl.run()});  // the controller's Saved event says where
      break;
    case SaveKind::Stats: {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      if (f) f.write(d.csv.data(), std::streamsize(d.csv.size()));
      f.flush();
      if (!f) {
        ui.error = "Cannot write the stats to '" + path + "'.";
        return false;
      }
      ui.csv_path = path;
      add_notice(ui, "Saved the stats of " + std::to_string(tl.step_count()) + " steps (" +
                         format_bytes(d.csv.size()) + ") to " + path);
      break;
    }
    case SaveKind::ViewPng:
      ui.export_png_path = path;
      ui.export_png = true;  // the window loop renders the view into it after this frame
      break;
  }
  d.open = false;
  return true;
}

void panel_save_dialog(UiState& ui, Controller* ctl, const ControllerState& cs,
                       const Timeline& tl) {
  SaveDialog& d = ui.save;
  char id[64];
  std::snprintf(id, sizeof id, "%s###save_dialog", kind_title(d.kind));
  if (d.open_request) {
    d.open_request = false;
    d.open = true;
    ImGui::OpenPopup(id);
  }
  if (!d.open) return;
  const ImGuiIO& io = ImGui::GetIO();
  const float w = std::min(600.0f * ImGui::GetFontSize() / 15.0f, io.DisplaySize.x - 40.0f);
  ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x * 0.5f, io.DisplaySize.y * 0.5f),
                          ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSize(ImVec2(w, 0), ImGuiCond_Always);
  if (!ImGui::BeginPopupModal(id, nullptr, ImGuiWindowFlags_NoSavedSettings)) {
    d.open = false;
    return;
  }
  folder_chooser(d);
  ImGui::TextDisabled("File name");
  ImGui::SetNextItemWidth(-1.0f);
  bool enter = ImGui::InputText("##name", &d.name, ImGuiInputTextFlags_EnterReturnsTrue);
  note_shown(ui, "save file", (fs::path(d.folder) / d.name).string());

  // The size, said before anything is written.
  const uint64_t bytes = save_dialog_bytes(ui, cs);
  const ImVec4 warn(1.0f, 0.8f, 0.3f, 1.0f);
  char size[160];
  switch (d.kind) {
    case SaveKind::Run:
      if (bytes == 0)
        std::snprintf(size, sizeof size, "Size: not known (this run's history was not kept)");
      else
        std::snprintf(size, sizeof size, "Size: %s (%d steps, every step's attention rows)",
                      format_bytes(bytes).c_str(), tl.step_count());
      break;
    case SaveKind::Stats:
      std::snprintf(size, sizeof size, "Size: %s (%d steps, one line each)",
                    format_bytes(bytes).c_str(), tl.step_count());
      break;
    case SaveKind::ViewPng: {
      auto [pw, ph] = view_pixels(ui);
      std::snprintf(size, sizeof size, "Size: at most %s (%d x %d pixels, less once compressed)",
                    format_bytes(bytes).c_str(), pw, ph);
      break;
    }
  }
  if (bytes >= kLargeFile) {
    std::snprintf(size + std::strlen(size), sizeof size - std::strlen(size), ": a large file");
    ImGui::TextColored(warn, "%s", size);
  } else {
    ImGui::TextUnformatted(size);
  }
  note_shown(ui, "save size", size);
  std::error_code ec;
  const fs::path path = fs::path(d.folder) / d.name;
  if (!d.name.empty() && fs::exists(path, ec)) {
    const std::string there =
        "A file of that name is there (" +
        format_bytes(fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0) +
        "): Save replaces it.";
    ImGui::TextColored(warn, "%s", there.c_str());
    note_shown(ui, "save replaces", there);
  }
  const std::string problem = save_problem(d, bytes);
  if (!problem.empty()) {
    ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.4f, 1.0f), "%s", problem.c_str());
    note_shown(ui, "save problem", problem);
  }

  ImGui::Separator();
  ImGui::BeginDisabled(!problem.empty());
  if ((ImGui::Button("Save", ImVec2(120, 0)) || (enter && problem.empty())) &&
      save_dialog_confirm(ui, ctl, cs, tl))
    ImGui::CloseCurrentPopup();
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (ImGui::Button("Cancel", ImVec2(120, 0)) ||
      ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape))) {
    d.open = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

}  // namespace kvscope::app
