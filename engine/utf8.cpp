// utf8.cpp — UTF-8 validation, classification and streaming (see utf8.h).
#include "engine/utf8.h"

#include <cstdint>

namespace kvscope {

// Classification of the UTF-8 sequence starting at s[i].
Utf8Seq classify_utf8(std::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return {Utf8SeqKind::Valid, 1};
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;  // no overlongs
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {Utf8SeqKind::Invalid, 1};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {Utf8SeqKind::Truncated, k};
    const auto c = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
    if (c < l || c > h) return {Utf8SeqKind::Invalid, k};
  }
  return {Utf8SeqKind::Valid, need + 1};
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Seq q = classify_utf8(pending_, i);
    if (q.kind == Utf8SeqKind::Truncated) break;  // may still complete: hold it
    if (q.kind == Utf8SeqKind::Valid) {
      out.append(pending_, i, q.len);
    } else {
      out += kUtf8Replacement;
    }
    i += q.len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8Seq q = classify_utf8(pending_, i);
    if (q.kind == Utf8SeqKind::Valid) {
      out.append(pending_, i, q.len);
    } else {
      out += kUtf8Replacement;
    }
    i += q.len;
  }
  pending_.clear();
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool utf8_valid(std::string_view s, size_t* bad_offset) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const Utf8Seq q = classify_utf8(s, i);
    if (q.kind != Utf8SeqKind::Valid) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += q.len;
  }
  return true;
}

}  // namespace kvscope
