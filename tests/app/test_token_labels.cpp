// test_token_labels.cpp — token texts come from the model file: the label the UI draws
// (scene labels, candidates panel, inspector all use app::display_text) shows control
// bytes as visible escapes, keeps its whitespace symbols, and is always valid UTF-8.
#include <gtest/gtest.h>

#include <string>

#include "app/scene/scene_builder.h"
#include "engine/utf8.h"

namespace kvscope::app {
namespace {

TEST(TokenLabels, ControlBytesFromTheFileAreVisibleEscapes) {
  EXPECT_EQ(display_text(std::string("\x1b[31mred", 8)), "\\x1b[31mred");
  EXPECT_EQ(display_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(display_text("\xc2\x9b"
                         "2J"),
            "\\u009b2J");
  EXPECT_EQ(display_text("\xff"), "\\xff");
  EXPECT_TRUE(utf8_valid(display_text("\xe2\x82")));
}

TEST(TokenLabels, WhitespaceSymbolsStay) {
  EXPECT_EQ(display_text("a\nb"),
            "a\xE2\x86\xB5"
            "b");  // ↵
  EXPECT_EQ(display_text("\tx"),
            "\xE2\x86\x92"
            "x");                                     // →
  EXPECT_EQ(display_text("  "), "\xC2\xB7\xC2\xB7");  // spaces only: middle dots
}

}  // namespace
}  // namespace kvscope::app
