// gl_test_context.cpp — EGL (no display) or hidden GLFW window + glad loading for tests.
#include "gl_test_context.h"

#include <GLFW/glfw3.h>

#include <cstdlib>

namespace kvscope::test {
namespace {
std::string g_glfw_error;
void on_glfw_error(int code, const char* msg) {
  g_glfw_error = msg ? msg : "unknown";
}
}  // namespace

std::unique_ptr<GlTestContext> GlTestContext::create(std::string* why) {
  std::unique_ptr<GlTestContext> headless(new GlTestContext());
  auto egl = render::HeadlessGl::create();
  if (egl.ok()) {
    headless->headless_ = std::move(egl).value();
    return headless;
  }
  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    *why = egl.error().message + "; glfwInit failed (" + g_glfw_error +
           "); DISPLAY=" + (std::getenv("DISPLAY") ? std::getenv("DISPLAY") : "(unset)");
    return nullptr;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  glfwWindowHint(GLFW_VISIBLE, GLFW_FALSE);
  GLFWwindow* w = glfwCreateWindow(64, 64, "kvscope-test", nullptr, nullptr);
  if (!w) {
    *why = "no OpenGL 3.3 core context (" + g_glfw_error + ")";
    glfwTerminate();
    return nullptr;
  }
  glfwMakeContextCurrent(w);
  if (Status st = render::load_gl(glfwGetProcAddress); !st.ok()) {
    *why = st.message();
    glfwDestroyWindow(w);
    glfwTerminate();
    return nullptr;
  }
  std::unique_ptr<GlTestContext> ctx(new GlTestContext());
  ctx->window_ = w;
  return ctx;
}

GlTestContext::~GlTestContext() {
  if (!window_) return;  // EGL: headless_ releases itself
  glfwDestroyWindow(static_cast<GLFWwindow*>(window_));
  glfwTerminate();
}

std::unique_ptr<render::Renderer> GlTestContext::make_renderer() {
  render::RendererOptions opts;
  opts.shader_dir = render::find_shader_dir("");
  auto r = render::Renderer::create(opts);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : nullptr;
}

}  // namespace kvscope::test
