// test_prompt_wrap.cpp — the prompt box's soft wrap: every line fits the box, the prompt
// never gains or loses a character through the wrapping, and typing, Backspace, Delete,
// Ctrl+Enter and pasting in the wrapped text edit the prompt as they would unwrapped.
#include "app/ui/prompt_wrap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

using namespace kvscope::app;

namespace {

// One unit per character (UTF-8 aware), as a monospace font.
float chars(std::string_view s) {
  float n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '\n')
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

std::string trim_right(std::string s) {
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// Types `typed` one character at a time at the cursor, as the box does: the edit goes into
// the shown text, is mapped back to the prompt, and the prompt is wrapped again.
struct Box {
  float width;
  SoftWrapped shown;
  size_t cursor = 0;  // in shown.text
  Box(const std::string& plain, float w) : width(w), shown(soft_wrap(plain, w, chars)) {}
  void apply(const std::string& after, size_t cursor_after) {
    PlainEdit e = unwrap_edit(shown, cursor, after, cursor_after);
    shown = soft_wrap(e.text, width, chars);
    cursor = shown.to_display(e.cursor);
  }
  void type(const std::string& s) {
    for (char c : s) {
      std::string after = shown.text;
      after.insert(cursor, 1, c);
      apply(after, cursor + 1);
    }
  }
  void backspace() {
    std::string after = shown.text;
    after.erase(cursor - 1, 1);
    apply(after, cursor - 1);
  }
  void del() {
    std::string after = shown.text;
    after.erase(cursor, 1);
    apply(after, cursor);
  }
};

}  // namespace

TEST(PromptWrap, EveryLineFitsAndThePromptIsUnchanged) {
  const std::string plain =
      "Once upon a time, in a kingdom far away, there lived a lighthouse keeper who counted "
      "every ship that passed.\nThe end.";
  for (float width : {12.0f, 20.0f, 33.0f, 200.0f}) {
    SoftWrapped w = soft_wrap(plain, width, chars);
    EXPECT_EQ(w.plain(), plain) << width;
    for (const std::string& line : lines_of(w.text))
      EXPECT_LE(chars(trim_right(line)), width) << "'" << line << "' at width " << width;
    // The prompt's own line break is not a soft one.
    size_t hard = 0;
    for (size_t i = 0; i < w.text.size(); ++i)
      if (w.text[i] == '\n' && !std::binary_search(w.breaks.begin(), w.breaks.end(), i)) ++hard;
    EXPECT_EQ(hard, 1u) << width;
  }
  EXPECT_TRUE(soft_wrap(plain, 200.0f, chars).breaks.empty());
  // Words stay whole: at width 20 the first line ends after "kingdom"'s predecessor.
  EXPECT_EQ(lines_of(soft_wrap(plain, 20.0f, chars).text)[0], "Once upon a time, in ");
}

TEST(PromptWrap, AWordWiderThanTheLineIsCutWhereItFillsIt) {
  SoftWrapped w = soft_wrap("ab abcdefghijklmnop", 5.0f, chars);
  EXPECT_EQ(w.text, "ab \nabcde\nfghij\nklmno\np");
  EXPECT_EQ(w.plain(), "ab abcdefghijklmnop");
  // Multi-byte characters are never split (é is two bytes, one character).
  SoftWrapped u = soft_wrap("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 3.0f, chars);
  EXPECT_EQ(u.text, "\xC3\xA9\xC3\xA9\xC3\xA9\n\xC3\xA9");
}

TEST(PromptWrap, OffsetsMapBothWays) {
  SoftWrapped w = soft_wrap("aaaa bbbb cccc", 5.0f, chars);
  ASSERT_EQ(w.text, "aaaa \nbbbb \ncccc");
  EXPECT_EQ(w.to_display(0), 0u);
  EXPECT_EQ(w.to_display(4), 4u);
  EXPECT_EQ(w.to_display(5), 6u);  // the start of "bbbb": after the break
  EXPECT_EQ(w.to_display(10), 12u);
  EXPECT_EQ(w.to_display(14), 16u);
  for (size_t p = 0; p <= 14; ++p) EXPECT_EQ(w.to_plain(w.to_display(p)), p);
}

TEST(PromptWrap, TypingPastTheEdgeWrapsAndThePromptKeepsWhatWasTyped) {
  Box box("", 10.0f);
  const std::string typed = "the lighthouse keeper counted every ship";
  box.type(typed);
  EXPECT_EQ(box.shown.plain(), typed);
  EXPECT_FALSE(box.shown.breaks.empty());
  EXPECT_EQ(box.cursor, box.shown.text.size()) << "the cursor follows the typing";
  for (const std::string& line : lines_of(box.shown.text))
    EXPECT_LE(chars(trim_right(line)), 10.0f) << line;
  // In the middle too: the cursor stays after what was typed.
  box.cursor = box.shown.to_display(4);  // after "the "
  box.type("old ");
  EXPECT_EQ(box.shown.plain(), "the old lighthouse keeper counted every ship");
  EXPECT_EQ(box.shown.to_plain(box.cursor), 8u);
}

TEST(PromptWrap, BackspaceAndDeleteAcrossASoftBreakEditThePrompt) {
  Box box("aaaa bbbb", 5.0f);
  ASSERT_EQ(box.shown.text, "aaaa \nbbbb");
  box.cursor = 6;   // the start of the second line
  box.backspace();  // deletes the space before the break, not the break
  EXPECT_EQ(box.shown.plain(), "aaaabbbb");
  EXPECT_EQ(box.shown.to_plain(box.cursor), 4u);

  Box end("aaaa bbbb", 5.0f);
  end.cursor = 5;  // the end of the first line, before the break
  end.del();       // deletes the first character of the next line
  EXPECT_EQ(end.shown.plain(), "aaaa bbb");
  EXPECT_EQ(end.shown.to_plain(end.cursor), 5u);

  Box mid("aaaa bbbb", 5.0f);
  mid.cursor = 8;  // after "bb"
  mid.backspace();
  EXPECT_EQ(mid.shown.plain(), "aaaa bbb");
}

TEST(PromptWrap, TypedAndPastedLineBreaksStay) {
  Box box("ab cd", 3.0f);
  ASSERT_EQ(box.shown.text, "ab \ncd");
  box.cursor = 3;  // after the space, before the soft break
  box.type("\n");  // Ctrl+Enter
  EXPECT_EQ(box.shown.plain(), "ab \ncd");
  EXPECT_TRUE(box.shown.breaks.empty());

  Box paste("one two three", 8.0f);
  ASSERT_EQ(paste.shown.text, "one two \nthree");
  std::string after = paste.shown.text;
  after.insert(4, "X\nY ");
  PlainEdit e = unwrap_edit(paste.shown, 4, after, 8);
  EXPECT_EQ(e.text, "one X\nY two three");
  EXPECT_EQ(e.cursor, 8u);
}
