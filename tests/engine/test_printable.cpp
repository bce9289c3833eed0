// test_printable.cpp — file-derived text is shown with visible escapes: nothing a
// terminal acts on, no NUL, always valid UTF-8, and ordinary text (backslashes, accents,
// CJK, emoji) unchanged.
#include <gtest/gtest.h>

#include <string>

#include "engine/printable.h"
#include "engine/utf8.h"

namespace kvscope {
namespace {

using std::string;

TEST(Printable, ControlBytesBecomeVisibleEscapes) {
  EXPECT_EQ(printable_name(string("a\x1b[31mb", 7)), "a\\x1b[31mb");
  EXPECT_EQ(printable_name(string("x\0y", 3)), "x\\x00y");  // a NUL no longer ends the text
  EXPECT_EQ(printable_name("bell\x07 del\x7f cr\r"), "bell\\x07 del\\x7f cr\\x0d");
  EXPECT_EQ(printable_name("line\nnext\ttab"), "line\\x0anext\\x09tab");
  EXPECT_EQ(printable_text("line\nnext\ttab\r"), "line\nnext\ttab\\x0d");  // lines kept
}

TEST(Printable, C1ControlsAndBidiOverridesAreEscaped) {
  EXPECT_EQ(printable_text("\xc2\x9b"
                           "2J"),
            "\\u009b2J");                            // U+009B: the 8-bit CSI
  EXPECT_EQ(printable_text("\xc2\x85"), "\\u0085");  // NEL
  EXPECT_EQ(printable_text("abc\xe2\x80\xae"
                           "fed"),
            "abc\\u202efed");  // RIGHT-TO-LEFT OVERRIDE
  EXPECT_EQ(printable_text("\xe2\x81\xa6x\xe2\x81\xa9"), "\\u2066x\\u2069");  // isolates
  EXPECT_EQ(printable_name("a\xe2\x80\xa8"
                           "b"),
            "a\\u2028b");  // line separator, one line only
  EXPECT_EQ(printable_text("a\xe2\x80\xa8"
                           "b"),
            "a\xe2\x80\xa8"
            "b");
}

TEST(Printable, InvalidUtf8BytesAreEscapedOneByOne) {
  EXPECT_EQ(printable_text("ok\xff\xfe"), "ok\\xff\\xfe");
  EXPECT_EQ(printable_text("\xe2\x82"), "\\xe2\\x82");           // truncated sequence
  EXPECT_EQ(printable_text("\xc0\xaf"), "\\xc0\\xaf");           // overlong
  EXPECT_EQ(printable_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(printable_text("\xe2\x82"
                           "A"),
            "\\xe2\\x82"
            "A");  // the next byte survives
}

TEST(Printable, OrdinaryTextIsUnchangedAndEscapingIsIdempotent) {
  const string text = "path\\to\\file \"q\" caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 \xe2\x86\xb5";
  EXPECT_EQ(printable_text(text), text);
  EXPECT_EQ(printable_name(text), text);
  const char raw[] = "\x1b]8;;http://x\x07\0\xff\xc2\x9b\xe2\x80\xae\n";
  const string nasty(raw, sizeof raw - 1);
  const string once = printable_name(nasty);
  EXPECT_EQ(printable_name(once), once);
  EXPECT_TRUE(utf8_valid(once));
  for (unsigned char c : once) EXPECT_GE(c, 0x20) << "control byte left in " << once;
}

// Every byte value, alone and after a lead byte: the output is valid UTF-8 without C0
// controls (other than the kept newline and tab) or DEL.
TEST(Printable, EveryByteGivesValidPrintableOutput) {
  for (int b = 0; b < 256; ++b) {
    for (const string& in :
         {string(1, char(b)), string("\xc3") + char(b), string("\xe2\x80") + char(b)}) {
      const string out = printable_text(in);
      ASSERT_TRUE(utf8_valid(out)) << b;
      for (unsigned char c : out)
        ASSERT_TRUE(c >= 0x20 ? c != 0x7f : (c == '\n' || c == '\t')) << b << " -> " << out;
    }
  }
}

// A token on screen (scene labels, the Serving view's lanes, the panels) is one line: its
// newline and tab are symbols, a token of spaces is a row of middle dots, and what
// printable_text escapes stays escaped.
TEST(Printable, LabelsShowWhitespaceAsSymbols) {
  EXPECT_EQ(printable_label("a\nz"), "a\xE2\x86\xB5z");           // ↵
  EXPECT_EQ(printable_label("\tx"), "\xE2\x86\x92x");             // →
  EXPECT_EQ(printable_label("   "), "\xC2\xB7\xC2\xB7\xC2\xB7");  // ···
  EXPECT_EQ(printable_label(" the"), " the");                     // a leading space is kept
  EXPECT_EQ(printable_label("cr\r"), "cr\\x0d");
  EXPECT_EQ(printable_label(string("\x1b[31m", 5)), "\\x1b[31m");
  EXPECT_EQ(printable_label(""), "");
}

}  // namespace
}  // namespace kvscope
