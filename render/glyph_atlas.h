// glyph_atlas.h — a single-channel glyph atlas baked from a TrueType font.
//
// Baked once on the CPU with stb_truetype (no GL needed, so it is unit-testable);
// the renderer uploads `pixels` as an R8 texture. Covers Latin, Greek, Cyrillic,
// general punctuation, arrows and a few symbols; anything else maps to '?'.
// Layout units: one text line is 1.0 tall (ascent - descent), baseline at y = 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "render/gl.h"

namespace kvscope::render {

struct Glyph {
  float u0 = 0, v0 = 0, u1 = 0, v1 = 0;  // atlas texture coordinates
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // quad relative to the pen, line units, y up
  float advance = 0;                     // line units
};

// One positioned glyph of a laid-out string (line units, y up, baseline y = 0).
struct GlyphQuad {
  float x0, y0, x1, y1;
  float u0, v0, u1, v1;
};

class GlyphAtlas {
 public:
  // Bakes `ttf_path` at `pixel_height` px per line into a size x size atlas.
  static Expected<GlyphAtlas> bake(const std::string& ttf_path, float pixel_height, int size);
  // The default UI/label font: DejaVu Sans from the usual system locations.
  static std::string find_default_font();

  // Lays out one line of UTF-8 text starting at pen x = 0; returns the total advance.
  float layout(std::string_view utf8, std::vector<GlyphQuad>* out) const;
  const Glyph* find(uint32_t codepoint) const;

  int size() const { return size_; }
  const std::vector<uint8_t>& pixels() const { return pixels_; }  // size*size, row 0 = top
  float descent() const { return descent_; }                      // negative, line units
  size_t glyph_count() const { return glyphs_.size(); }

 private:
  int size_ = 0;
  std::vector<uint8_t> pixels_;
  std::unordered_map<uint32_t, Glyph> glyphs_;
  float descent_ = 0;
};

// Decodes one code point from `s` at `*i` and advances; invalid bytes give U+FFFD.
uint32_t next_codepoint(std::string_view s, size_t* i);

}  // namespace kvscope::render
