// gl.h — OpenGL loading, owned GL objects and shader programs.
//
// Every GL object here has exactly one owner (move-only wrappers delete on destruction).
// Programs are compiled from files at run time; a compile or link failure returns an
// error naming the file and the stage with the driver's log, and no program is kept.
// Requires a current OpenGL 3.3 core context on the calling thread.
#pragma once

#include <string>
#include <utility>

#include "common/status.h"

namespace kvscope::render {

// Same signature as glfwGetProcAddress, so the app can pass it without a cast.
using GlProc = void (*)();
using GlLoader = GlProc (*)(const char* name);

// Loads GL entry points through `loader` and checks the context is >= 3.3 core.
Status load_gl(GlLoader loader);
std::string gl_version_string();  // "4.5 (Core Profile) Mesa ..." + renderer

// Generic single-owner GL name. Deleter is a function taking the name.
template <void (*Delete)(unsigned)>
class GlName {
 public:
  GlName() = default;
  explicit GlName(unsigned id) : id_(id) {}
  GlName(GlName&& o) noexcept : id_(std::exchange(o.id_, 0u)) {}
  GlName& operator=(GlName&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, 0u);
    }
    return *this;
  }
  GlName(const GlName&) = delete;
  GlName& operator=(const GlName&) = delete;
  ~GlName() { reset(); }
  void reset() {
    if (id_) Delete(id_);
    id_ = 0;
  }
  unsigned get() const { return id_; }
  explicit operator bool() const { return id_ != 0; }

 private:
  unsigned id_ = 0;
};

void gl_delete_buffer(unsigned id);
void gl_delete_vertex_array(unsigned id);
void gl_delete_texture(unsigned id);
void gl_delete_framebuffer(unsigned id);
void gl_delete_renderbuffer(unsigned id);
void gl_delete_program(unsigned id);
using GlBuffer = GlName<gl_delete_buffer>;
using GlVertexArray = GlName<gl_delete_vertex_array>;
using GlTexture = GlName<gl_delete_texture>;
using GlFramebuffer = GlName<gl_delete_framebuffer>;
using GlRenderbuffer = GlName<gl_delete_renderbuffer>;
using GlProgramName = GlName<gl_delete_program>;

GlBuffer make_buffer();
GlVertexArray make_vertex_array();
GlTexture make_texture();

// A linked vertex+fragment program.
class ShaderProgram {
 public:
  // Reads <dir>/<name>.vert and <dir>/<name>.frag, compiles and links them.
  static Expected<ShaderProgram> load(const std::string& dir, const std::string& name);
  unsigned id() const { return prog_.get(); }
  int uniform(const char* name) const;  // -1 when the uniform is absent/unused
  void use() const;

 private:
  GlProgramName prog_;
};

// Clears the whole bound framebuffer (width x height px) to an opaque color.
void clear_framebuffer(int width, int height, float r, float g, float b);

// Returns when every command issued to the current context has finished (glFinish).
void finish();

// Finds the shader directory: <exe_dir>/shaders if it has the files, else the source
// tree's shaders/ (compiled in), else "". `probe` is a file name that must exist there.
std::string find_shader_dir(const std::string& exe_dir, const std::string& probe = "block.vert");

}  // namespace kvscope::render
