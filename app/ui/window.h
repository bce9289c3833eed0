// window.h — GLFW window + OpenGL 3.3 core context creation with one clear error.
//
// Used by the GUI (visible, resizable, vsync, HiDPI-aware); capture and the render
// benchmark use an OffscreenContext (EGL without a display, else a hidden window). Owns
// GLFW: the first GlWindow initializes it and the destructor terminates it.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "render/headless_gl.h"

struct GLFWwindow;

namespace kvscope::app {

struct WindowOptions {
  int width = 1600, height = 900;
  bool visible = true;
  bool vsync = true;
  int samples = 4;
  std::string title = "kvscope";
};

class GlWindow {
 public:
  // Errors: no display, no OpenGL 3.3 core, GL loading failure — each one line.
  static Expected<std::unique_ptr<GlWindow>> create(const WindowOptions& opts);
  ~GlWindow();
  GLFWwindow* handle() const { return window_; }
  // Framebuffer size in pixels (differs from the window size on HiDPI screens).
  void framebuffer_size(int* w, int* h) const;
  float content_scale() const;
  std::string gl_description() const { return gl_desc_; }

 private:
  GlWindow() = default;
  GLFWwindow* window_ = nullptr;
  std::string gl_desc_;
};

// A current OpenGL 3.3 core context for drawing offscreen (capture, benchmarks): EGL
// with no display server first, else a hidden GLFW window (needs a display).
class OffscreenContext {
 public:
  // Errors carry both attempts' reasons in one line.
  static Expected<std::unique_ptr<OffscreenContext>> create();
  ~OffscreenContext();
  const std::string& description() const { return desc_; }

 private:
  OffscreenContext() = default;
  std::unique_ptr<render::HeadlessGl> headless_;
  std::unique_ptr<GlWindow> window_;
  std::string desc_;
};

// Directory of the running executable (for shaders/ next to it).
std::string executable_dir();

}  // namespace kvscope::app
