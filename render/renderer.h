// renderer.h — draws a render::Scene with OpenGL 3.3 core.
//
// One instanced draw per element kind: grid, token blocks, KV blocks, markers, head
// sphere, head halo, beams, label glyphs (at most 8 draw calls however long the sequence).
// Owns every GL object it creates; needs a current GL context for its whole life
// (create, draw and destruction on the context's thread).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "render/gl.h"
#include "render/glyph_atlas.h"
#include "render/scene.h"

namespace kvscope::render {

// The parts of a frame, in drawing order (FrameStats::pass_ms).
enum class Pass { Prepare, Clear, Tokens, KvBlocks, Markers, Head, Grid, Beams, Halo, Glyphs };
inline constexpr int kPassCount = 10;
const char* pass_name(Pass p);

struct FrameStats {
  int draw_calls = 0;
  size_t tokens = 0, kv_blocks = 0, beams = 0, glyphs = 0;
  size_t drawn_tokens = 0, drawn_kv_blocks = 0, drawn_glyphs = 0;  // in view, so drawn
  size_t drawn_beams = 0;     // after the level of detail for beams to tokens out of view
  double cpu_ms = 0;          // time spent in draw() on the CPU (building + submitting)
  double prepare_ms = 0;      // part of cpu_ms spent packing and uploading instances
  size_t uploaded_bytes = 0;  // instance bytes sent to the GPU this frame
  bool reused = false;        // the scene's revision matched: no packing, no upload
  // With Renderer::set_profile_passes: milliseconds each part took, the GPU's work
  // included (glFinish after each; slower than a normal frame, for finding what costs).
  std::array<double, kPassCount> pass_ms{};
};

struct RendererOptions {
  std::string shader_dir;  // where block.vert etc. live (see find_shader_dir)
  std::string font_path;   // TrueType font for labels; empty = DejaVu Sans
  float font_pixels = 40;  // atlas bake height of one line
};

class Renderer {
 public:
  // Compiles the programs, bakes the glyph atlas and creates meshes. GL must be loaded.
  static Expected<std::unique_ptr<Renderer>> create(const RendererOptions& opts);
  ~Renderer();

  // Clears and draws `scene` into the currently bound framebuffer of width x height px.
  void draw(const Scene& scene, int width, int height) {
    draw(scene, width, height, Viewport{0, 0, width, height});
  }
  // Draws `scene` into `view` (top-left origin, clipped to the framebuffer) of a
  // fb_width x fb_height framebuffer; only that rectangle is cleared and touched. The
  // projection uses the rectangle's aspect, so framing computed for it holds exactly.
  void draw(const Scene& scene, int fb_width, int fb_height, Viewport view);
  const FrameStats& last_stats() const { return stats_; }
  const GlyphAtlas& atlas() const { return atlas_; }
  // Times each part of the frame (FrameStats::pass_ms) by finishing the GPU's work after it.
  void set_profile_passes(bool on) { profile_passes_ = on; }

 private:
  Renderer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  GlyphAtlas atlas_;
  FrameStats stats_;
  bool profile_passes_ = false;
};

}  // namespace kvscope::render
