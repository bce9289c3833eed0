// panel_text.h — text helpers the panels share. A panel explains a number with a tooltip
// on the line that shows it; hover_tooltip() is that one step, so every panel's read-outs
// behave alike (same hover rule, same tooltip window) and stay printf-checked.
#pragma once

#include <imgui.h>

#include <cstdarg>
#include <string>

namespace kvscope::app {

// While the last item (e.g. the line of text just drawn) is hovered, shows `fmt` formatted
// with the arguments as its tooltip; otherwise does nothing.
inline void hover_tooltip(const char* fmt, ...) IM_FMTARGS(1);
inline void hover_tooltip(const char* fmt, ...) {
  if (!ImGui::IsItemHovered()) return;
  va_list args;
  va_start(args, fmt);
  ImGui::SetTooltipV(fmt, args);
  va_end(args);
}

// `text` shortened to whole characters plus "..." so it fits `width` points (unchanged when
// it fits already). The caller shows the whole text as the tooltip when they differ.
inline std::string fit_text(std::string text, float width) {
  if (ImGui::CalcTextSize(text.c_str()).x <= width) return text;
  while (!text.empty() && ImGui::CalcTextSize((text + "...").c_str()).x > width) {
    size_t n = text.size();  // drop the last character: its continuation bytes, its lead
    do --n;
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80);
    text.resize(n);
  }
  return text + "...";
}

}  // namespace kvscope::app
