// offscreen.cpp — FBO creation, MSAA resolve, glReadPixels and PNG output.
#include "render/offscreen.h"

#include <glad/gl.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cstring>

namespace kvscope::render {
namespace {

GlFramebuffer make_fbo() {
  GLuint id = 0;
  glGenFramebuffers(1, &id);
  return GlFramebuffer(id);
}

GlRenderbuffer make_rb(GLenum format, int w, int h, int samples) {
  GLuint id = 0;
  glGenRenderbuffers(1, &id);
  glBindRenderbuffer(GL_RENDERBUFFER, id);
  if (samples > 1)
    glRenderbufferStorageMultisample(GL_RENDERBUFFER, samples, format, w, h);
  else
    glRenderbufferStorage(GL_RENDERBUFFER, format, w, h);
  return GlRenderbuffer(id);
}

}  // namespace

Expected<OffscreenTarget> OffscreenTarget::create(int width, int height, int samples) {
  if (width < 1 || height < 1 || width > 16384 || height > 16384)
    return make_error("offscreen: size " + std::to_string(width) + "x" + std::to_string(height) +
                        " out of range [1, 16384]");
  GLint max_samples = 1;
  glGetIntegerv(GL_MAX_SAMPLES, &max_samples);
  OffscreenTarget t;
  t.width_ = width;
  t.height_ = height;
  t.samples_ = std::clamp(samples, 1, std::max(1, int(max_samples)));

  t.msaa_fbo_ = make_fbo();
  glBindFramebuffer(GL_FRAMEBUFFER, t.msaa_fbo_.get());
  t.msaa_color_ = make_rb(GL_RGBA8, width, height, t.samples_);
  glFramebufferRenderbuffer(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER,
                            t.msaa_color_.get());
  t.msaa_depth_ = make_rb(GL_DEPTH_COMPONENT24, width, height, t.samples_);
  glFramebufferRenderbuffer(GL_FRAMEBUFFER, GL_DEPTH_ATTACHMENT, GL_RENDERBUFFER,
                            t.msaa_depth_.get());
  GLenum status = glCheckFramebufferStatus(GL_FRAMEBUFFER);
  if (status != GL_FRAMEBUFFER_COMPLETE) {
    glBindFramebuffer(GL_FRAMEBUFFER, 0);
    return make_error("offscreen: framebuffer incomplete (status 0x" + std::to_string(status) +
                        ") at " + std::to_string(width) + "x" + std::to_string(height) + " with " +
                        std::to_string(t.samples_) + " samples");
  }
  t.resolve_fbo_ = make_fbo();
  glBindFramebuffer(GL_FRAMEBUFFER, t.resolve_fbo_.get());
  t.resolve_color_ = make_rb(GL_RGBA8, width, height, 1);
  glFramebufferRenderbuffer(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER,
                            t.resolve_color_.get());
  status = glCheckFramebufferStatus(GL_FRAMEBUFFER);
  glBindFramebuffer(GL_FRAMEBUFFER, 0);
  if (status != GL_FRAMEBUFFER_COMPLETE)
    return make_error("offscreen: resolve framebuffer incomplete (status 0x" +
                        std::to_string(status) + ")");
  return t;
}

void OffscreenTarget::bind() const {
  glBindFramebuffer(GL_FRAMEBUFFER, msaa_fbo_.get());
  glViewport(0, 0, width_, height_);
}

void OffscreenTarget::bind_default() {
  glBindFramebuffer(GL_FRAMEBUFFER, 0);
}

Expected<std::vector<uint8_t>> OffscreenTarget::read_rgba() const {
  glBindFramebuffer(GL_READ_FRAMEBUFFER, msaa_fbo_.get());
  glBindFramebuffer(GL_DRAW_FRAMEBUFFER, resolve_fbo_.get());
  glBlitFramebuffer(0, 0, width_, height_, 0, 0, width_, height_, GL_COLOR_BUFFER_BIT, GL_NEAREST);
  glBindFramebuffer(GL_READ_FRAMEBUFFER, resolve_fbo_.get());
  std::vector<uint8_t> px(size_t(width_) * height_ * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(0, 0, width_, height_, GL_RGBA, GL_UNSIGNED_BYTE, px.data());
  glBindFramebuffer(GL_FRAMEBUFFER, 0);
  if (GLenum e = glGetError(); e != GL_NO_ERROR)
    return make_error("offscreen: OpenGL error 0x" + std::to_string(e) + " while reading pixels");
  // GL's row 0 is the bottom; flip to top-first.
  std::vector<uint8_t> rgba(px.size());
  size_t row = size_t(width_) * 4;
  for (int y = 0; y < height_; ++y)
    std::memcpy(rgba.data() + size_t(y) * row, px.data() + size_t(height_ - 1 - y) * row, row);
  return rgba;
}

Expected<std::vector<uint8_t>> read_window_rgba(int width, int height) {
  if (width < 1 || height < 1) return make_error("window capture: empty framebuffer");
  std::vector<uint8_t> px(size_t(width) * height * 4);
  glBindFramebuffer(GL_READ_FRAMEBUFFER, 0);
  glReadBuffer(GL_BACK);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, px.data());
  if (GLenum e = glGetError(); e != GL_NO_ERROR)
    return make_error("window capture: OpenGL error 0x" + std::to_string(e));
  std::vector<uint8_t> rgba(px.size());
  size_t row = size_t(width) * 4;
  for (int y = 0; y < height; ++y)
    std::memcpy(rgba.data() + size_t(y) * row, px.data() + size_t(height - 1 - y) * row, row);
  for (size_t i = 3; i < rgba.size(); i += 4) rgba[i] = 255;  // opaque PNG
  return rgba;
}

Status write_png(const std::string& path, int width, int height, const std::vector<uint8_t>& rgba) {
  if (width < 1 || height < 1 || rgba.size() != size_t(width) * height * 4)
    return make_error("png: pixel buffer of " + std::to_string(rgba.size()) +
                        " bytes does not match " + std::to_string(width) + "x" +
                        std::to_string(height) + " RGBA");
  if (!stbi_write_png(path.c_str(), width, height, 4, rgba.data(), width * 4))
    return make_error("png: cannot write '" + path +
                        "' (does the folder exist and is it writable?)");
  return {};
}

}  // namespace kvscope::render
