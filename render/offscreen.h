// offscreen.h — render into a multisampled framebuffer object and read the pixels back.
//
// bind() makes the MSAA FBO the draw target; read_rgba() resolves it and returns tightly
// packed RGBA8 rows, top row first. Owns its GL objects; needs the creating context.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "render/gl.h"

namespace kvscope::render {

class OffscreenTarget {
 public:
  // samples: 1 = no MSAA; clamped to what the driver supports.
  static Expected<OffscreenTarget> create(int width, int height, int samples);
  void bind() const;           // binds the draw FBO (call Renderer::draw afterwards)
  static void bind_default();  // back to the window's framebuffer
  Expected<std::vector<uint8_t>> read_rgba() const;
  int width() const { return width_; }
  int height() const { return height_; }

 private:
  int width_ = 0, height_ = 0, samples_ = 1;
  GlFramebuffer msaa_fbo_, resolve_fbo_;
  GlRenderbuffer msaa_color_, msaa_depth_, resolve_color_;
};

// Reads the window's back buffer (bound default framebuffer) as RGBA8, top row first.
Expected<std::vector<uint8_t>> read_window_rgba(int width, int height);

// Writes RGBA8 pixels (top row first) as a PNG. Errors name the path.
Status write_png(const std::string& path, int width, int height, const std::vector<uint8_t>& rgba);

}  // namespace kvscope::render
