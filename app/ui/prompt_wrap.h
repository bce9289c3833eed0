// prompt_wrap.h — soft word wrap for the prompt box. Dear ImGui 1.86's multiline text box
// cannot wrap, so a long line ran off the box's right edge. The box shows the prompt with
// line breaks inserted where a line would pass its width ("soft breaks"); their offsets are
// known, so they never reach the prompt: every edit in the box is mapped back to the prompt
// (unwrap_edit) and the result wrapped again. No ImGui: the box measures text for it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kvscope::app {

// Width of a piece of single-line text on screen (any unit: the same as the wrap width).
using TextWidth = std::function<float(std::string_view)>;

// The prompt as the box shows it.
struct SoftWrapped {
  std::string text;            // the prompt with a '\n' at every soft break
  std::vector<size_t> breaks;  // offsets in `text` of the soft breaks, ascending

  std::string plain() const;  // the prompt: `text` without its soft breaks
  // An offset in the prompt to one in `text`; at a soft break, the start of the next line.
  size_t to_display(size_t plain_offset) const;
  // An offset in `text` to one in the prompt.
  size_t to_plain(size_t display_offset) const;
};

// Breaks every line of `plain` (its own '\n' stay) so that no line's text passes `width`:
// after the last run of spaces that keeps it within the width (the spaces stay at the end
// of the line), or inside a word wider than the line, at the last character that fits (at
// least one per line). Text is measured a word or a space run at a time and summed.
SoftWrapped soft_wrap(std::string_view plain, float width, const TextWidth& measure);

// The prompt after an edit in the box, and its cursor.
struct PlainEdit {
  std::string text;
  size_t cursor = 0;
};
// `before` was shown with the cursor at `cursor_before`; the box now holds `after`, its
// cursor at `cursor_after` (byte offsets). The edited range is what lies between the text
// the two share at the start and at the end (the cursor bounds both: typing, deleting and
// pasting end with the cursor just after the change). Soft breaks outside it are taken
// out; line breaks typed or pasted stay. Deleting a soft break alone (Backspace at the
// start of a wrapped line, Delete at the end of one) deletes the character beyond it, as
// if the line were not wrapped.
PlainEdit unwrap_edit(const SoftWrapped& before, size_t cursor_before, std::string_view after,
                      size_t cursor_after);

}  // namespace kvscope::app
