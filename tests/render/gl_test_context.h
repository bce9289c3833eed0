// gl_test_context.h — an OpenGL 3.3 core context for tests: EGL with no display server
// (render::HeadlessGl), else a hidden GLFW window on the X display.
//
// When neither works tests skip with a message instead of failing:
// GL_TEST_CONTEXT_OR_SKIP(ctx) in a test body.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "render/headless_gl.h"
#include "render/renderer.h"

namespace kvscope::test {

class GlTestContext {
 public:
  // Creates the window and loads GL; on failure returns null and sets *why.
  static std::unique_ptr<GlTestContext> create(std::string* why);
  ~GlTestContext();
  // A renderer using the source tree's shaders.
  std::unique_ptr<render::Renderer> make_renderer();

 private:
  GlTestContext() = default;
  std::unique_ptr<render::HeadlessGl> headless_;
  void* window_ = nullptr;
};

}  // namespace kvscope::test

#define GL_TEST_CONTEXT_OR_SKIP(ctx)                                  \
  std::string gl_skip_reason_;                                        \
  auto ctx = ::kvscope::test::GlTestContext::create(&gl_skip_reason_); \
  if (!ctx) GTEST_SKIP() << "no OpenGL display: " << gl_skip_reason_
