// glyph_atlas.cpp — baking DejaVu Sans into an atlas with stb_truetype's packer.
#include "render/glyph_atlas.h"

#include <stb_rect_pack.h>
#include <stb_truetype.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace kvscope::render {
namespace {

struct Range {
  uint32_t first, last;
};
// Code point ranges baked into the atlas.
constexpr Range kRanges[] = {
    {0x20, 0x7E},     {0xA0, 0x17F},    {0x370, 0x3FF},   {0x400, 0x45F},
    {0x2010, 0x205E}, {0x2190, 0x21FF}, {0x2200, 0x22FF}, {0x2300, 0x23FF},
    {0x2500, 0x257F}, {0x25A0, 0x25FF}, {0xFFFD, 0xFFFD},
};

}  // namespace

uint32_t next_codepoint(std::string_view s, size_t* i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(*i);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + len > s.size()) {
    ++*i;
    return 0xFFFD;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    unsigned char cc = byte(*i + k);
    if ((cc >> 6) != 2) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  *i += len;
  return cp;
}

std::string GlyphAtlas::find_default_font() {
  std::error_code ec;
  // KVSCOPE_FONT names another DejaVu Sans (a machine without fonts-dejavu-core).
  if (const char* env = std::getenv("KVSCOPE_FONT"); env && *env && std::filesystem::exists(env, ec))
    return env;
  const char* candidates[] = {
      "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
      "/usr/share/fonts/TTF/DejaVuSans.ttf",
      "/usr/share/fonts/dejavu/DejaVuSans.ttf",
      "/usr/local/share/fonts/DejaVuSans.ttf",
  };
  for (const char* c : candidates)
    if (std::filesystem::exists(c, ec)) return c;
  return "";
}

Expected<GlyphAtlas> GlyphAtlas::bake(const std::string& ttf_path, float pixel_height,
                                      int size) {
  if (ttf_path.empty())
    return make_error("font: DejaVu Sans not found (install fonts-dejavu-core)");
  std::ifstream f(ttf_path, std::ios::binary);
  if (!f) return make_error("font: cannot read '" + ttf_path + "'");
  std::vector<unsigned char> ttf((std::istreambuf_iterator<char>(f)), {});
  if (ttf.size() < 12) return make_error("font: '" + ttf_path + "' is not a TrueType file");
  if (size < 64 || size > 8192 || pixel_height < 4 || pixel_height > 256)
    return make_error("font: atlas size " + std::to_string(size) + " or pixel height " +
                        std::to_string(pixel_height) + " out of range [64, 8192] / [4, 256]");

  stbtt_fontinfo info;
  int offset = stbtt_GetFontOffsetForIndex(ttf.data(), 0);
  if (offset < 0 || !stbtt_InitFont(&info, ttf.data(), offset))
    return make_error("font: '" + ttf_path + "' could not be parsed as TrueType");
  int ascent = 0, descent = 0, gap = 0;
  stbtt_GetFontVMetrics(&info, &ascent, &descent, &gap);
  float scale = stbtt_ScaleForPixelHeight(&info, pixel_height);
  float line_px = (ascent - descent) * scale;

  GlyphAtlas a;
  a.size_ = size;
  a.pixels_.assign(size_t(size) * size, 0);
  a.descent_ = descent * scale / line_px;

  stbtt_pack_context pc;
  if (!stbtt_PackBegin(&pc, a.pixels_.data(), size, size, 0, 2, nullptr))
    return make_error("font: stb_truetype could not start packing");
  stbtt_PackSetOversampling(&pc, 1, 1);
  std::vector<std::vector<stbtt_packedchar>> packed;
  std::vector<stbtt_pack_range> ranges;
  for (const Range& r : kRanges) {
    packed.emplace_back(r.last - r.first + 1);
    stbtt_pack_range pr{};
    pr.font_size = pixel_height;
    pr.first_unicode_codepoint_in_range = int(r.first);
    pr.num_chars = int(r.last - r.first + 1);
    pr.chardata_for_range = packed.back().data();
    ranges.push_back(pr);
  }
  int ok = stbtt_PackFontRanges(&pc, ttf.data(), 0, ranges.data(), int(ranges.size()));
  stbtt_PackEnd(&pc);
  if (!ok)
    return make_error("font: glyphs of '" + ttf_path + "' at " + std::to_string(pixel_height) +
                        " px do not fit a " + std::to_string(size) + " px atlas");

  for (size_t ri = 0; ri < std::size(kRanges); ++ri) {
    for (uint32_t cp = kRanges[ri].first; cp <= kRanges[ri].last; ++cp) {
      if (cp != 0x20 && stbtt_FindGlyphIndex(&info, int(cp)) == 0) continue;  // not in font
      const stbtt_packedchar& pch = packed[ri][cp - kRanges[ri].first];
      Glyph g;
      g.u0 = pch.x0 / float(size);
      g.v0 = pch.y0 / float(size);
      g.u1 = pch.x1 / float(size);
      g.v1 = pch.y1 / float(size);
      g.x0 = pch.xoff / line_px;
      g.x1 = pch.xoff2 / line_px;
      g.y0 = -pch.yoff2 / line_px;  // stb's y runs down
      g.y1 = -pch.yoff / line_px;
      g.advance = pch.xadvance / line_px;
      a.glyphs_[cp] = g;
    }
  }
  return a;
}

const Glyph* GlyphAtlas::find(uint32_t cp) const {
  auto it = glyphs_.find(cp);
  return it == glyphs_.end() ? nullptr : &it->second;
}

float GlyphAtlas::layout(std::string_view utf8, std::vector<GlyphQuad>* out) const {
  float pen = 0;
  const Glyph* fallback = find('?');
  for (size_t i = 0; i < utf8.size();) {
    uint32_t cp = next_codepoint(utf8, &i);
    const Glyph* g = find(cp);
    if (!g) g = fallback;
    if (!g) continue;
    if (g->x1 > g->x0 && out)
      out->push_back({pen + g->x0, g->y0, pen + g->x1, g->y1, g->u0, g->v0, g->u1, g->v1});
    pen += g->advance;
  }
  return pen;
}

}  // namespace kvscope::render
