// headless_gl.h — an OpenGL 3.3 core context with no window and no display server.
//
// EGL on Mesa's surfaceless platform (software llvmpipe or any Mesa GPU driver), else the
// first EGL device (e.g. NVIDIA's driver), else EGL's default display. Drawing goes to
// framebuffer objects (see offscreen.h); there is no default framebuffer. The context is
// current on the creating thread for the object's whole life; destruction releases it.
#pragma once

#include <memory>
#include <string>

#include "render/gl.h"

namespace kvscope::render {

class HeadlessGl {
 public:
  // Errors name what EGL lacked (no EGL, no OpenGL 3.3 core, ...), one line each.
  static Expected<std::unique_ptr<HeadlessGl>> create();
  ~HeadlessGl();
  HeadlessGl(const HeadlessGl&) = delete;
  HeadlessGl& operator=(const HeadlessGl&) = delete;
  // "EGL surfaceless: 4.5 (Core Profile) Mesa ... / llvmpipe ..."
  const std::string& description() const { return desc_; }

 private:
  HeadlessGl() = default;
  void* display_ = nullptr;
  void* context_ = nullptr;
  std::string desc_;
};

}  // namespace kvscope::render
