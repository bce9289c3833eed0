// panel_text.h — text helpers the panels share. A panel explains a number with a tooltip
// on the line that shows it; hover_tooltip() is that one step, so every panel's read-outs
// behave alike (same hover rule, same tooltip window) and stay printf-checked.
#pragma once

#include <imgui.h>

#include <cstdarg>

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

}  // namespace kvscope::app
