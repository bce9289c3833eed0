// window.cpp — GLFW setup and GL loading.
#include "app/ui/window.h"

#include <GLFW/glfw3.h>

#include <cstdlib>
#include <filesystem>

#include "render/gl.h"

namespace kvscope::app {
namespace {
std::string g_last_glfw_error;
void on_glfw_error(int, const char* msg) {
  g_last_glfw_error = msg ? msg : "unknown error";
}
}  // namespace

Expected<std::unique_ptr<GlWindow>> GlWindow::create(const WindowOptions& opts) {
  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    const char* d = std::getenv("DISPLAY");
    return make_error(
        "cannot open a window: no display (", g_last_glfw_error, "; DISPLAY=", d ? d : "unset",
        "). Run on a desktop, under xvfb-run, or use `kvscope generate` for text only");
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  glfwWindowHint(GLFW_VISIBLE, opts.visible ? GLFW_TRUE : GLFW_FALSE);
  glfwWindowHint(GLFW_RESIZABLE, GLFW_TRUE);
#ifdef GLFW_SCALE_TO_MONITOR
  glfwWindowHint(GLFW_SCALE_TO_MONITOR, GLFW_TRUE);
#endif
  auto open = [&](int samples) -> Expected<GLFWwindow*> {
    glfwWindowHint(GLFW_SAMPLES, samples);
    GLFWwindow* w = glfwCreateWindow(opts.width, opts.height, opts.title.c_str(), nullptr, nullptr);
    if (!w)
      return make_error("cannot create an OpenGL 3.3 core window (", g_last_glfw_error,
                        "); update the graphics driver or try LIBGL_ALWAYS_SOFTWARE=1");
    glfwMakeContextCurrent(w);
    glfwSwapInterval(opts.vsync ? 1 : 0);
    if (Status st = render::load_gl(glfwGetProcAddress); !st.ok()) {
      glfwDestroyWindow(w);
      return st.error();
    }
    return w;
  };
  auto w = open(opts.samples);
  // Multisampling multiplies the cost of every pixel in a software rasterizer (llvmpipe):
  // there the window is reopened without it so large scenes stay interactive.
  if (w.ok() && opts.samples > 1) {
    const std::string desc = render::gl_version_string();
    if (desc.find("llvmpipe") != std::string::npos || desc.find("softpipe") != std::string::npos) {
      glfwDestroyWindow(*w);
      w = open(0);
    }
  }
  if (!w.ok()) {
    glfwTerminate();
    return w.error();
  }
  std::unique_ptr<GlWindow> out(new GlWindow());
  out->window_ = *w;
  out->gl_desc_ = render::gl_version_string();
  return out;
}

GlWindow::~GlWindow() {
  if (window_) glfwDestroyWindow(window_);
  glfwTerminate();
}

void GlWindow::framebuffer_size(int* w, int* h) const {
  glfwGetFramebufferSize(window_, w, h);
}

float GlWindow::content_scale() const {
  float sx = 1, sy = 1;
  glfwGetWindowContentScale(window_, &sx, &sy);
  return sx > 0 ? sx : 1.0f;
}

Expected<std::unique_ptr<OffscreenContext>> OffscreenContext::create() {
  std::unique_ptr<OffscreenContext> c(new OffscreenContext());
  auto egl = render::HeadlessGl::create();
  if (egl.ok()) {
    c->headless_ = std::move(egl).value();
    c->desc_ = c->headless_->description();
    return c;
  }
  WindowOptions wo;
  wo.visible = false;
  wo.vsync = false;
  wo.width = 64;
  wo.height = 64;
  auto w = GlWindow::create(wo);
  if (!w.ok())
    return make_error("no OpenGL for offscreen drawing: ", egl.error().message, "; and ",
                      w.error().message);
  c->window_ = std::move(w.value());
  c->desc_ = "hidden window: " + c->window_->gl_description();
  return c;
}

OffscreenContext::~OffscreenContext() = default;

std::string executable_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.parent_path().string();
}

}  // namespace kvscope::app
