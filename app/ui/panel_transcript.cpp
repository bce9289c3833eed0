// panel_transcript.cpp — the transcript in the story strip under the view: the sequence so
// far as wrapped text, one hoverable span per token (prompt tokens dim, generated ones
// bright), following the newest words unless the person scrolled back; an older step looked
// at through History has its token outlined and scrolled into sight.
//
// Linked both ways with the 3D view: hovering a token here highlights its block there
// (ui.panel_hovered_pos), and the token hovered in the view is highlighted here and
// scrolled into sight. Token widths are measured once per run and lines rebuilt only when
// the width changes, so thousands of tokens cost a clipped draw of the visible lines.
#include <imgui.h>

#include <algorithm>

#include "app/scene/scene_builder.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

void update_cache(TranscriptCache& c, const Timeline& tl, float wrap) {
  const auto& toks = tl.tokens();
  const float font = ImGui::GetFontSize();
  if (c.run != tl.run() || c.font_size != font || toks.size() < c.texts.size()) {
    c = TranscriptCache{};
    c.run = tl.run();
    c.font_size = font;
  }
  // Tokens can be rewritten in place (a prompt step fills all prompt positions at once),
  // so re-measure from the first one whose text changed.
  size_t first_changed = c.texts.size();
  for (size_t i = c.texts.size() > 8 ? c.texts.size() - 8 : 0; i < c.texts.size(); ++i)
    if (c.texts[i] != display_text(toks[i].text)) {
      first_changed = i;
      break;
    }
  if (first_changed < c.texts.size()) {
    c.texts.resize(first_changed);
    c.widths.resize(first_changed);
    c.breaks.resize(first_changed);
    c.laid_out = 0;
  }
  for (size_t i = c.texts.size(); i < toks.size(); ++i) {
    c.texts.push_back(display_text(toks[i].text));
    c.widths.push_back(ImGui::CalcTextSize(c.texts.back().c_str()).x);
    c.breaks.push_back(toks[i].text.find('\n') != std::string::npos);
  }
  if (wrap != c.wrap) {
    c.wrap = wrap;
    c.laid_out = 0;
  }
  if (c.laid_out == 0) c.line_first.assign(1, 0);
  // Continue the last line from where the previous frame stopped.
  float x = 0;
  for (int i = c.line_first.back(); i < int(c.laid_out); ++i) x += c.widths[size_t(i)];
  for (size_t i = c.laid_out; i < c.texts.size(); ++i) {
    float w = c.widths[i];
    if (x > 0 && x + w > wrap) {
      c.line_first.push_back(int(i));
      x = 0;
    }
    x += w;
    if (c.breaks[i]) {
      c.line_first.push_back(int(i) + 1);
      x = 0;
    }
  }
  c.laid_out = c.texts.size();
}

}  // namespace

void panel_transcript(UiState& ui, const Timeline& tl, ImVec2 size) {
  const auto& toks = tl.tokens();
  ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(6.0f, 3.0f));
  ImGui::BeginChild("##transcript", size, true);
  ImGui::PopStyleVar();
  if (toks.empty()) {
    ImGui::TextDisabled("no text yet: press Play or Step");
    ImGui::EndChild();
    return;
  }
  const float line_h = ImGui::GetTextLineHeightWithSpacing();
  const float wrap = std::max(ImGui::GetContentRegionAvail().x, 40.0f);
  TranscriptCache& c = ui.transcript;
  const size_t lines_before = c.line_first.size();
  const bool was_at_bottom = ImGui::GetScrollY() >= ImGui::GetScrollMaxY() - 1.0f;
  update_cache(c, tl, wrap);
  const int n = int(c.texts.size());
  const int n_lines = int(c.line_first.size());
  auto line_end = [&](int line) { return line + 1 < n_lines ? c.line_first[size_t(line) + 1] : n; };

  // The token hovered in the 3D view: scroll its line into sight once.
  // Positions renumber after a context shift; the transcript keeps every token.
  const int from_view = ui.hovered_pos >= 0 ? tl.token_index(ui.hovered_pos) : -1;
  int scroll_line = -1;
  if (from_view >= 0 && from_view < n && from_view != c.follow_pos) {
    auto it = std::upper_bound(c.line_first.begin(), c.line_first.end(), from_view);
    scroll_line = int(it - c.line_first.begin()) - 1;
  }
  c.follow_pos = from_view;
  // An older step looked at through History: its token is outlined and scrolled to once.
  const int viewed = tl.live() || !tl.viewed() ? -1 : tl.token_index(tl.viewed()->pos);
  if (viewed >= 0 && viewed < n && viewed != c.viewed_index && scroll_line < 0) {
    auto it = std::upper_bound(c.line_first.begin(), c.line_first.end(), viewed);
    scroll_line = int(it - c.line_first.begin()) - 1;
  }
  c.viewed_index = viewed;

  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const bool hover_window = ImGui::IsWindowHovered();
  int hovered = -1;
  ImVec2 last_min, last_max;  // the last line's rectangle
  ImGuiListClipper clip;
  clip.Begin(n_lines, line_h);
  while (clip.Step()) {
    for (int line = clip.DisplayStart; line < clip.DisplayEnd; ++line) {
      ImVec2 p = ImGui::GetCursorScreenPos();
      float x = p.x;
      for (int i = c.line_first[size_t(line)]; i < line_end(line); ++i) {
        float w = c.widths[size_t(i)];
        ImVec2 a(x, p.y), b(x + w, p.y + ImGui::GetTextLineHeight());
        bool over = hover_window && mouse.x >= a.x && mouse.x < b.x && mouse.y >= a.y &&
                    mouse.y < b.y + (line_h - ImGui::GetTextLineHeight());
        if (over) hovered = i;
        if (over || i == from_view)
          dl->AddRectFilled(a, b, over ? IM_COL32(255, 220, 110, 90) : IM_COL32(255, 220, 110, 150),
                            2.0f);
        if (i == viewed) {
          dl->AddRect(a, b, IM_COL32(255, 200, 80, 255), 2.0f, 0, 1.5f);
          note_shown(ui, "viewed word", c.texts[size_t(i)], a, b);
        }
        const bool prompt = toks[size_t(i)].prompt;
        ImU32 col = prompt ? IM_COL32(150, 165, 200, 255) : IM_COL32(255, 200, 170, 255);
        if (i == n - 1 && !prompt) col = IM_COL32(255, 150, 100, 255);  // the newest token
        dl->AddText(a, col, c.texts[size_t(i)].c_str());
        x += w;
      }
      ImGui::Dummy(ImVec2(std::max(x - p.x, 1.0f), ImGui::GetTextLineHeight()));
      if (line == n_lines - 1) {
        last_min = p;
        last_max = ImVec2(x, p.y + ImGui::GetTextLineHeight());
      }
    }
  }
  clip.End();
  if (scroll_line >= 0 && !hover_window) {
    // The part of the lines the child shows: its height less the padding above and below.
    const float y = scroll_line * line_h;
    const float shown = ImGui::GetWindowHeight() - 2.0f * ImGui::GetStyle().WindowPadding.y;
    if (y < ImGui::GetScrollY() || y + line_h > ImGui::GetScrollY() + shown)
      ImGui::SetScrollY(std::max(0.0f, y - (shown - line_h) * 0.5f));
  } else if (was_at_bottom && c.line_first.size() != lines_before && viewed < 0) {
    ImGui::SetScrollHereY(1.0f);  // keep following the newest text
  }
  if (last_max.x > last_min.x) {
    std::string words;
    for (int i = c.line_first.back(); i < n; ++i) words += c.texts[size_t(i)];
    note_shown(ui, "last words", std::move(words), last_min, last_max);
  }
  ImGui::EndChild();
  if (hovered >= 0)
    ui.panel_hovered_pos = tl.position_of_index(hovered);
  else if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "%d tokens (%d prompt, dim); hover a word to find it in 3D", n,
        int(std::count_if(toks.begin(), toks.end(), [](const TokenInfo& t) { return t.prompt; })));
}

}  // namespace kvscope::app
