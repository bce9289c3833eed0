// app_frame.cpp — the layout's regions as fixed, undecorated ImGui windows.
//
// Each region is one window pinned to its rectangle (no move, no resize, no title bar);
// the story strip under the view never scrolls (the numbers and the words are always on
// screen); the side columns scroll and hold collapsible sections under a header with a "hide panel"
// button; a closed column is a thin strip that is one "show" button. Notices stack in the
// top-right corner of the 3D view, each with its own close button, and fade after a while
// (the Run section keeps their text under Messages).
#include "app/ui/app_frame.h"

#include <imgui.h>

#include <algorithm>
#include <string_view>
#include <cstdio>
#include <string>

#include "app/ui/ui_region.h"
#include "render/glyph_atlas.h"

namespace kvscope::app {
namespace {

// The header row of an open column: its name, then a framed "hide" button at the row's
// right end whose arrow points where the column goes. It must not read as a section header
// (those are the full-width collapsing rows below it), so it is a plain labelled button.
void column_header(const char* title, bool left, ColumnMode* mode) {
  ImGui::AlignTextToFramePadding();
  ImGui::TextDisabled("%s", title);
  const char* label = left ? "\xC2\xAB hide panel" : "hide panel \xC2\xBB";  // « »
  const ImGuiStyle& st = ImGui::GetStyle();
  const float w = ImGui::CalcTextSize(label).x + st.FramePadding.x * 2.0f;
  ImGui::SameLine(std::max(ImGui::GetContentRegionMax().x - w, ImGui::GetCursorPosX()));
  if (ImGui::SmallButton(label)) *mode = ColumnMode::Closed;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Hide this column (more room for the scene); the strip left behind shows it again");
  ImGui::Separator();
}

// A closed column: the whole strip is one button that opens it again, an arrow pointing
// into the window and "show" written down the strip.
void closed_column(const char* contents, bool left, ColumnMode* mode) {
  const char* label = left ? "\xC2\xBB\n\ns\nh\no\nw" : "\xC2\xAB\n\ns\nh\no\nw";
  ImGui::PushStyleVar(ImGuiStyleVar_ButtonTextAlign, ImVec2(0.5f, 0.0f));
  ImGui::PushStyleVar(ImGuiStyleVar_FramePadding,
                      ImVec2(0.0f, ImGui::GetStyle().FramePadding.y * 2));
  if (ImGui::Button(label, ImGui::GetContentRegionAvail())) *mode = ColumnMode::Open;
  ImGui::PopStyleVar(2);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Show %s", contents);
}

void draw_notices(UiState& ui) {
  const UiRect& v = ui.layout.view;
  const double now = ImGui::GetTime();
  float y = v.y + 8.0f;
  const float width = std::min(380.0f * ui_scale(), v.w - 16.0f);
  for (size_t i = 0; i < ui.notices.size();) {
    Notice& n = ui.notices[i];
    if (n.shown_at < 0) n.shown_at = now;
    if (n.seconds > 0 && now - n.shown_at > n.seconds) {
      ui.notices.erase(ui.notices.begin() + long(i));
      continue;
    }
    char id[32];
    std::snprintf(id, sizeof id, "##notice%llu", static_cast<unsigned long long>(n.id));
    ImGui::SetNextWindowPos(ImVec2(v.right() - 8.0f, y), ImGuiCond_Always, ImVec2(1.0f, 0.0f));
    ImGui::SetNextWindowSizeConstraints(ImVec2(0, 0), ImVec2(width, v.h * 0.5f));
    // A timed notice fades out over its last kNoticeFadeSeconds (its text with the style's
    // alpha, its background with its own, which the style's does not reach).
    const double left = n.seconds > 0 ? n.seconds - (now - n.shown_at) : kNoticeFadeSeconds;
    const float alpha = float(std::clamp(left / kNoticeFadeSeconds, 0.0, 1.0));
    ImGui::SetNextWindowBgAlpha(0.88f * alpha);
    ImGui::PushStyleVar(ImGuiStyleVar_Alpha, alpha);
    bool close = false;
    ImGui::Begin(id, nullptr,
                 ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_AlwaysAutoResize |
                     ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoFocusOnAppearing |
                     ImGuiWindowFlags_NoNav);
    ImGui::PushTextWrapPos(width - ImGui::GetFrameHeight() * 2.0f);
    ImGui::TextUnformatted(n.text.c_str());
    ImGui::PopTextWrapPos();
    ImGui::SameLine();
    close = ImGui::SmallButton("x");
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Dismiss");
    y += ImGui::GetWindowHeight() + 6.0f;
    ImGui::End();
    ImGui::PopStyleVar();
    if (close)
      ui.notices.erase(ui.notices.begin() + long(i));
    else
      ++i;
  }
}

// The inner edge of an open column can be dragged to resize it: a few points of the view
// next to it take the pointer (the column's own edge holds its scrollbar).
void column_splitters(UiState& ui) {
  ImGuiIO& io = ImGui::GetIO();
  const UiLayout& L = ui.layout;
  const float grab = 6.0f * ui_scale();
  const ImVec2 m = io.MousePos;
  auto over = [&](const UiRect& col, bool left) {
    float edge = left ? col.right() : col.x;
    float x0 = left ? edge : edge - grab;
    return m.y >= col.y && m.y < col.bottom() && m.x >= x0 && m.x < x0 + grab;
  };
  if (ui.splitter_drag == 0 && !io.WantCaptureMouse) {
    int side = L.left_open && over(L.left, true) ? -1 : L.right_open && over(L.right, false) ? 1 : 0;
    if (side != 0) {
      ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeEW);
      if (ImGui::IsMouseClicked(0)) ui.splitter_drag = side;
    }
  }
  if (ui.splitter_drag != 0) {
    if (!ImGui::IsMouseDown(0)) {
      ui.splitter_drag = 0;
      return;
    }
    ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeEW);
    float w = ui.splitter_drag < 0 ? m.x : io.DisplaySize.x - m.x;
    w = std::clamp(w / ui_scale(), kMinColumnWidth, kMaxColumnWidth * 1.5f);
    (ui.splitter_drag < 0 ? ui.layout_prefs.left_width : ui.layout_prefs.right_width) = w;
  }
}

}  // namespace

float ui_scale() {
  // Fonts are loaded at 15 px times the content scale; the layout follows the same factor.
  float s = ImGui::GetFontSize() / 15.0f;
  return s > 0.5f ? s : 1.0f;
}

void setup_imgui_style(float content_scale) {
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  std::string font = render::GlyphAtlas::find_default_font();
  if (!font.empty()) {
    // Latin, Greek, Cyrillic and the arrows used to show whitespace tokens (↵ →).
    static const ImWchar kRanges[] = {0x0020, 0x024F, 0x0370, 0x03FF, 0x0400, 0x04FF,
                                      0x2000, 0x206F, 0x2190, 0x21FF, 0};
    io.Fonts->AddFontFromFileTTF(font.c_str(), 15.0f * content_scale, nullptr, kRanges);
  }
  ImGui::StyleColorsDark();
  ImGuiStyle& st = ImGui::GetStyle();
  st.ScaleAllSizes(content_scale);
  st.Colors[ImGuiCol_WindowBg] = ImVec4(0.075f, 0.08f, 0.10f, 0.97f);
}

namespace {
// `name` is one of the comma-separated names of `list`.
bool listed(std::string_view list, std::string_view name) {
  for (size_t at = 0; at <= list.size() && !list.empty();) {
    size_t end = std::min(list.find(',', at), list.size());
    if (list.substr(at, end - at) == name) return true;
    at = end + 1;
  }
  return false;
}

// A collapsible section. Screenshots (--sections A,B) open the listed ones, close the rest.
bool section(const UiState& ui, const char* name, bool open_at_start = true) {
  if (!ui.solo_sections.empty())
    ImGui::SetNextItemOpen(listed(ui.solo_sections, name), ImGuiCond_Always);
  return ImGui::CollapsingHeader(name, open_at_start ? ImGuiTreeNodeFlags_DefaultOpen : 0);
}
}  // namespace

void draw_frame_ui(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl,
                   ShownRange shown) {
  ImGuiIO& io = ImGui::GetIO();
  ui.layout = compute_layout(io.DisplaySize.x, io.DisplaySize.y, ui.layout_prefs, ui_scale());
  const UiLayout& L = ui.layout;
  ui.panel_hovered_pos = -1;
  ui.shown.clear();
  ImGui::PushStyleVar(ImGuiStyleVar_WindowRounding, 0.0f);
  ImGui::PushStyleVar(ImGuiStyleVar_WindowBorderSize, 1.0f);

  if (!L.toolbar.empty()) {
    ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding,
                        ImVec2(8.0f, (L.toolbar.h - ImGui::GetFrameHeight()) * 0.5f));
    begin_region("##toolbar", L.toolbar, ImGuiWindowFlags_NoScrollbar);
    ImGui::PopStyleVar();
    panel_toolbar(ui, ctl, cs, tl);
    ImGui::End();
  }

  // Left column: what to run and what to look at, then the text so far.
  if (!L.left_open) ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(2.0f, 2.0f));
  begin_region("##left", L.left, L.left_open ? 0 : ImGuiWindowFlags_NoScrollbar);
  if (!L.left_open) ImGui::PopStyleVar();
  if (L.left_open) {
    column_header("kvscope", true, &ui.layout_prefs.left);
    if (section(ui, "Controls"))
      panel_controls(ui, ctl, cs, tl);
    if (section(ui, "Run"))
      panel_run(ui, ctl, cs, tl);
    if (section(ui, "Heads", false)) panel_heads(ui);  // rarely needed: starts folded
  } else {
    closed_column("the controls, the run and the heads", true, &ui.layout_prefs.left);
  }
  ImGui::End();

  // Right column: the numbers.
  if (!L.right_open) ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(2.0f, 2.0f));
  begin_region("##right", L.right, L.right_open ? 0 : ImGuiWindowFlags_NoScrollbar);
  if (!L.right_open) ImGui::PopStyleVar();
  if (L.right_open) {
    column_header("measured", false, &ui.layout_prefs.right);
    if (section(ui, "Stats")) panel_stats(ui, cs, tl);
    if (section(ui, "KV memory")) panel_memory(ui, tl);
    const bool quality_open = section(ui, "Cache quality", false);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "A cache (type, window) against f16 with the full context, on the same tokens");
    if (quality_open) panel_quality(ui);
    if (section(ui, "Top candidates"))
      panel_candidates(tl);
    if (section(ui, "Plots")) panel_plots(ui, tl);
  } else {
    closed_column("the stats, candidates and plots", false, &ui.layout_prefs.right);
  }
  ImGui::End();

  // Under the view: the numbers and the words, whatever the window's size.
  if (!L.story.empty()) {
    ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(8.0f, 5.0f));
    begin_region("##story", L.story, ImGuiWindowFlags_NoScrollbar);
    ImGui::PopStyleVar();
    panel_story(ui, cs, tl);
    ImGui::End();
  }

  if (!L.bottom.empty()) {
    begin_region("##bottom", L.bottom, ImGuiWindowFlags_NoScrollbar);
    panel_overview(ui, tl, shown.first, shown.last);
    ImGui::End();
  }
  ImGui::PopStyleVar(2);

  column_splitters(ui);
  // Screenshots: --sections "Large plots" opens the Plots section's large view.
  if (listed(ui.solo_sections, "Large plots")) ui.plots_window = true;
  panel_plots_window(ui, tl);
  draw_notices(ui);
  panel_save_dialog(ui, ctl, cs, tl);
  panel_error_modal(ui);
}

}  // namespace kvscope::app
