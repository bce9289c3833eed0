// printable.cpp — visible escapes for file-derived text (see printable.h).
#include "engine/printable.h"

#include <cstdint>

#include "engine/utf8.h"

namespace kvscope {
namespace {

constexpr char kHex[] = "0123456789abcdef";

void append_byte_escape(std::string& out, uint8_t b) {
  out += "\\x";
  out += kHex[b >> 4];
  out += kHex[b & 15];
}

void append_code_point_escape(std::string& out, uint32_t cp) {
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 15];
}

uint32_t decode(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (len) {
    case 2:
      return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3:
      return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

bool escaped_code_point(uint32_t cp, bool one_line) {
  if (cp >= 0x80 && cp <= 0x9F) return true;          // C1 controls (CSI, NEL, ...)
  if (cp >= 0x202A && cp <= 0x202E) return true;      // bidi embeddings and overrides
  if (cp >= 0x2066 && cp <= 0x2069) return true;      // bidi isolates
  return one_line && (cp == 0x2028 || cp == 0x2029);  // line / paragraph separator
}

std::string escape(std::string_view s, bool one_line) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      const bool keep = c >= 0x20 && c != 0x7F;
      const bool keep_space = !one_line && (c == '\n' || c == '\t');
      if (keep || keep_space) {
        out += static_cast<char>(c);
      } else {
        append_byte_escape(out, c);
      }
      ++i;
      continue;
    }
    const Utf8Seq q = classify_utf8(s, i);
    if (q.kind != Utf8SeqKind::Valid) {
      append_byte_escape(out, c);  // one byte at a time: the rest may start a valid sequence
      ++i;
      continue;
    }
    const uint32_t cp = decode(s, i, q.len);
    if (escaped_code_point(cp, one_line)) {
      append_code_point_escape(out, cp);
    } else {
      out.append(s.substr(i, q.len));
    }
    i += q.len;
  }
  return out;
}

}  // namespace

std::string printable_text(std::string_view bytes) {
  return escape(bytes, false);
}
std::string printable_name(std::string_view bytes) {
  return escape(bytes, true);
}

std::string printable_label(std::string_view bytes) {
  const std::string text = printable_text(bytes);
  std::string out;
  bool any_visible = false;
  for (char c : text) {
    if (c == '\n')
      out += "\xE2\x86\xB5";  // ↵
    else if (c == '\t')
      out += "\xE2\x86\x92";  // →
    else
      out += c;
    if (c != ' ') any_visible = true;
  }
  if (!any_visible && !text.empty()) {
    out.clear();
    for (size_t i = 0; i < text.size(); ++i) out += "\xC2\xB7";  // ·
  }
  return out;
}

}  // namespace kvscope
