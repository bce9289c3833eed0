// prompt_wrap.cpp — soft breaks in, soft breaks out.
#include "app/ui/prompt_wrap.h"

#include <algorithm>

namespace kvscope::app {
namespace {

bool continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

// The byte after the UTF-8 character that starts at `i`.
size_t next_char(std::string_view s, size_t i) {
  ++i;
  while (i < s.size() && continuation(s[i])) ++i;
  return i;
}
// The start of the UTF-8 character that ends just before `i` (i > 0).
size_t prev_char(std::string_view s, size_t i) {
  --i;
  while (i > 0 && continuation(s[i])) --i;
  return i;
}

// Appends the line [begin, end) of `plain` to `out`, broken to fit `width`.
void wrap_line(std::string_view plain, size_t begin, size_t end, float width,
               const TextWidth& measure, SoftWrapped* out) {
  size_t start = begin;  // first byte of the line being filled
  float used = 0;        // width of [start, j) without trailing spaces counted twice
  size_t last_break = std::string_view::npos;  // where the next line may start
  size_t j = start;
  auto cut = [&](size_t at) {
    out->text.append(plain.substr(start, at - start));
    out->breaks.push_back(out->text.size());
    out->text.push_back('\n');
    start = j = at;
    used = 0;
    last_break = std::string_view::npos;
  };
  while (j < end) {
    size_t word_end = j;
    while (word_end < end && plain[word_end] != ' ') ++word_end;
    size_t space_end = word_end;
    while (space_end < end && plain[space_end] == ' ') ++space_end;
    const float word = word_end > j ? measure(plain.substr(j, word_end - j)) : 0.0f;
    if (used + word > width) {
      if (last_break != std::string_view::npos) {  // the word starts the next line
        cut(last_break);
        continue;
      }
      // A word wider than the line: as many of its characters as fit (at least one).
      size_t k = next_char(plain, j);
      float w = used + measure(plain.substr(j, k - j));
      while (k < word_end) {
        const size_t n = next_char(plain, k);
        const float cw = measure(plain.substr(k, n - k));
        if (w + cw > width) break;
        w += cw;
        k = n;
      }
      if (k < word_end) {
        cut(k);
        continue;
      }
    }
    used += word;
    if (space_end > word_end) used += measure(plain.substr(word_end, space_end - word_end));
    if (space_end < end && space_end > word_end) last_break = space_end;
    j = space_end;
  }
  out->text.append(plain.substr(start, end - start));
}

}  // namespace

std::string SoftWrapped::plain() const {
  std::string out;
  out.reserve(text.size() - breaks.size());
  size_t from = 0;
  for (size_t b : breaks) {
    out.append(text, from, b - from);
    from = b + 1;
  }
  out.append(text, from, std::string::npos);
  return out;
}

size_t SoftWrapped::to_display(size_t plain_offset) const {
  size_t d = plain_offset;
  for (size_t i = 0; i < breaks.size(); ++i) {
    // Break i sits before the prompt's byte breaks[i] - i.
    if (breaks[i] - i > plain_offset) break;
    ++d;
  }
  return std::min(d, text.size());
}

size_t SoftWrapped::to_plain(size_t display_offset) const {
  const size_t before =
      size_t(std::lower_bound(breaks.begin(), breaks.end(), display_offset) - breaks.begin());
  return display_offset - before;
}

SoftWrapped soft_wrap(std::string_view plain, float width, const TextWidth& measure) {
  SoftWrapped out;
  out.text.reserve(plain.size() + plain.size() / 16);
  size_t i = 0;
  for (;;) {
    size_t end = plain.find('\n', i);
    if (end == std::string_view::npos) end = plain.size();
    wrap_line(plain, i, end, width, measure, &out);
    if (end == plain.size()) break;
    out.text.push_back('\n');  // the prompt's own line break
    i = end + 1;
  }
  return out;
}

PlainEdit unwrap_edit(const SoftWrapped& before, size_t cursor_before, std::string_view after,
                      size_t cursor_after) {
  const std::string& old = before.text;
  const size_t n0 = old.size(), n1 = after.size();
  cursor_after = std::min(cursor_after, n1);
  size_t p = 0;
  while (p < n0 && p < n1 && old[p] == after[p]) ++p;
  p = std::min(p, cursor_after);
  // Never split a UTF-8 character between the shared start and the edit.
  while (p > 0 && p < n1 && continuation(after[p])) --p;
  size_t s = 0;
  const size_t s_max = std::min(n0, n1) - p;
  while (s < s_max && old[n0 - 1 - s] == after[n1 - 1 - s]) ++s;
  s = std::min(s, n1 - cursor_after);
  while (s > 0 && n1 - s < n1 && continuation(after[n1 - s])) --s;

  // [p, n0 - s) of the old text became [p, n1 - s) of the new.
  PlainEdit e;
  const size_t kept_start = before.to_plain(p);
  const std::string old_plain = before.plain();
  const size_t kept_end = before.to_plain(n0 - s);  // the prompt's bytes from here on stay
  std::string inserted(after.substr(p, n1 - s - p));
  size_t from = kept_start, to = kept_end;
  const bool removed_one_soft_break =
      inserted.empty() && n0 - s == p + 1 &&
      std::binary_search(before.breaks.begin(), before.breaks.end(), p);
  if (removed_one_soft_break) {
    // Backspace from the start of the next line (the cursor was after the break): the
    // character before it goes; Delete at the end of the line: the one after it.
    if (cursor_before > p && from > 0)
      from = prev_char(old_plain, from);
    else if (cursor_before <= p && to < old_plain.size())
      to = next_char(old_plain, to);
  }
  e.text = old_plain.substr(0, from) + inserted + old_plain.substr(to);
  e.cursor = from + std::min(cursor_after - p, inserted.size());
  return e;
}

}  // namespace kvscope::app
