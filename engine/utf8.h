// utf8.h — UTF-8 helpers shared by the tokenizer and the session: validation, the
// classification of one sequence, encoding a code point, and a stream that never emits
// half a character.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvscope {

// Classification of the UTF-8 sequence starting at s[i] (i < s.size()).
enum class Utf8SeqKind { Valid, Invalid, Truncated };
struct Utf8Seq {
  Utf8SeqKind kind;
  size_t len;  // Valid: sequence length; Invalid: maximal invalid subpart; Truncated: bytes left
};
Utf8Seq classify_utf8(std::string_view s, size_t i);

constexpr const char* kUtf8Replacement = "\xEF\xBF\xBD";  // U+FFFD

// Streams token bytes into text that never ends in half a UTF-8 character: push()
// returns the longest complete prefix of everything pushed so far and holds the rest.
// Bytes that can never complete (invalid sequences) are emitted as U+FFFD.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();  // whatever is held, incomplete tails as U+FFFD
  bool holding() const { return !pending_.empty(); }

 private:
  std::string pending_;
};

// Appends the UTF-8 encoding of code point `cp` (<= U+10FFFF) to `out`.
void utf8_append(std::string& out, uint32_t cp);

// True if s is valid UTF-8; otherwise *bad_offset gets the first bad byte's offset.
bool utf8_valid(std::string_view s, size_t* bad_offset = nullptr);

}  // namespace kvscope
