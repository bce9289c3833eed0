// printable.h — file-derived text made safe to show: the one helper every place that
// displays a string from a model or run file goes through (error messages naming keys,
// tensors or values; token texts in the CLI, the JSON and the UI).
//
// A model file can put any bytes in a key, a tensor name or a token: terminal escape
// sequences, a NUL that cuts a C string short, carriage returns that overwrite a line,
// bidirectional overrides that reorder what a reader sees, invalid UTF-8. The result of
// these functions is valid UTF-8 in which all of those are visible escapes:
//   C0 controls and DEL     -> \xNN       (ESC -> \x1b, NUL -> \x00)
//   invalid UTF-8 bytes     -> \xNN
//   C1 controls U+0080..9F  -> \uNNNN
//   bidi embeddings/overrides/isolates (U+202A..202E, U+2066..2069) -> \uNNNN
// Everything else, backslashes included, is unchanged, so escaping twice changes nothing.
// printable_label is the one-line form a token takes on screen (a label over its block, a
// lane's piece, a panel's word): printable_text with the whitespace a token is often made of
// drawn as visible symbols.
#pragma once

#include <string>
#include <string_view>

namespace kvscope {

// Multi-line text (generated text, token texts): '\n' and '\t' are kept as they are.
std::string printable_text(std::string_view bytes);
// One line (names, error messages): '\n', '\t' and the line/paragraph separators
// U+2028/U+2029 are escaped too.
std::string printable_name(std::string_view bytes);
// A token's text for a label: printable_text, then '\n' as U+21B5 (↵) and '\t' as U+2192
// (→); a text of spaces only as that many U+00B7 (·), so a space token is seen at all.
// (A '\r' is already the escape \x0d.)
std::string printable_label(std::string_view bytes);

}  // namespace kvscope
