// headless_gl.cpp — EGL display selection, context creation and GL loading.
#include "render/headless_gl.h"

#include <EGL/egl.h>
#include <EGL/eglext.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace kvscope::render {
namespace {

bool has_extension(const char* list, const char* name) {
  if (!list) return false;
  const size_t n = std::strlen(name);
  for (const char* p = list; (p = std::strstr(p, name)) != nullptr; p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
  return false;
}

std::string egl_error_name(EGLint e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "EGL error 0x%04x", unsigned(e));
  return buf;
}

// Tries the platforms in order; returns an initialized display and its name.
EGLDisplay open_display(std::string* platform, std::string* why) {
  const char* client = eglQueryString(EGL_NO_DISPLAY, EGL_EXTENSIONS);
  auto get_platform_display = reinterpret_cast<PFNEGLGETPLATFORMDISPLAYEXTPROC>(
      eglGetProcAddress("eglGetPlatformDisplayEXT"));
  auto try_init = [&](EGLDisplay d, const char* name) -> EGLDisplay {
    if (d == EGL_NO_DISPLAY) return EGL_NO_DISPLAY;
    EGLint major = 0, minor = 0;
    if (!eglInitialize(d, &major, &minor)) {
      *why += std::string(name) + ": " + egl_error_name(eglGetError()) + "; ";
      return EGL_NO_DISPLAY;
    }
    *platform = name;
    return d;
  };
  if (get_platform_display && has_extension(client, "EGL_MESA_platform_surfaceless")) {
    EGLDisplay d =
        try_init(get_platform_display(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, nullptr),
                 "EGL surfaceless");
    if (d != EGL_NO_DISPLAY) return d;
  }
  if (get_platform_display && has_extension(client, "EGL_EXT_platform_device")) {
    auto query_devices =
        reinterpret_cast<PFNEGLQUERYDEVICESEXTPROC>(eglGetProcAddress("eglQueryDevicesEXT"));
    EGLDeviceEXT devices[8];
    EGLint n = 0;
    if (query_devices && query_devices(8, devices, &n))
      for (EGLint i = 0; i < n; ++i) {
        EGLDisplay d = try_init(get_platform_display(EGL_PLATFORM_DEVICE_EXT, devices[i], nullptr),
                                "EGL device");
        if (d != EGL_NO_DISPLAY) return d;
      }
  }
  return try_init(eglGetDisplay(EGL_DEFAULT_DISPLAY), "EGL default display");
}

}  // namespace

Expected<std::unique_ptr<HeadlessGl>> HeadlessGl::create() {
  std::string platform, why;
  EGLDisplay dpy = open_display(&platform, &why);
  if (dpy == EGL_NO_DISPLAY)
    return make_error("headless OpenGL: no EGL display could be opened (" + why +
                        "install libegl1 and libegl-mesa0)");
  std::unique_ptr<HeadlessGl> h(new HeadlessGl());
  h->display_ = dpy;  // the destructor terminates it from here on
  if (!eglBindAPI(EGL_OPENGL_API))
    return make_error("headless OpenGL: " + platform + " offers no desktop OpenGL (" +
                        egl_error_name(eglGetError()) + ")");
  const EGLint config_attrs[] = {EGL_SURFACE_TYPE, EGL_PBUFFER_BIT, EGL_RENDERABLE_TYPE,
                                 EGL_OPENGL_BIT, EGL_NONE};
  EGLConfig config = nullptr;
  EGLint n_config = 0;
  if (!eglChooseConfig(dpy, config_attrs, &config, 1, &n_config) || n_config < 1) {
    config = nullptr;  // EGL_KHR_no_config_context: a context needs no config
    if (!has_extension(eglQueryString(dpy, EGL_EXTENSIONS), "EGL_KHR_no_config_context"))
      return make_error("headless OpenGL: " + platform + " has no OpenGL config");
  }
  const EGLint ctx_attrs[] = {EGL_CONTEXT_MAJOR_VERSION,
                              3,
                              EGL_CONTEXT_MINOR_VERSION,
                              3,
                              EGL_CONTEXT_OPENGL_PROFILE_MASK,
                              EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT,
                              EGL_NONE};
  EGLContext ctx = eglCreateContext(dpy, config, EGL_NO_CONTEXT, ctx_attrs);
  if (ctx == EGL_NO_CONTEXT)
    return make_error("headless OpenGL: " + platform +
                        " cannot create an OpenGL 3.3 core context (" +
                        egl_error_name(eglGetError()) + ")");
  h->context_ = ctx;
  // No surface at all (EGL_KHR_surfaceless_context): drawing goes to framebuffer objects.
  if (!eglMakeCurrent(dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, ctx))
    return make_error("headless OpenGL: " + platform +
                        " cannot make a context current without a surface (" +
                        egl_error_name(eglGetError()) + ")");
  if (Status st = load_gl(reinterpret_cast<GlLoader>(eglGetProcAddress)); !st.ok())
    return st.error();
  h->desc_ = platform + ": " + gl_version_string();
  return h;
}

HeadlessGl::~HeadlessGl() {
  if (!display_) return;
  EGLDisplay dpy = static_cast<EGLDisplay>(display_);
  eglMakeCurrent(dpy, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
  if (context_) eglDestroyContext(dpy, static_cast<EGLContext>(context_));
  eglTerminate(dpy);
}

}  // namespace kvscope::render
