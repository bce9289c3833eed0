// window.h — GLFW window + OpenGL 3.3 core context creation with one clear error.
//
// Used by the GUI (visible, resizable, vsync, HiDPI-aware) and by headless capture and
// the render benchmark (hidden window; drawing goes to an offscreen FBO). Owns GLFW:
// the first GlWindow initializes it and the destructor terminates it.
#pragma once

#include <memory>
#include <string>

#include "engine/status.h"

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

// Directory of the running executable (for shaders/ next to it).
std::string executable_dir();

}  // namespace kvscope::app
