// gl.cpp — GL loading, object deleters and shader program building.
#include "render/gl.h"

#include <glad/gl.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvscope::render {
namespace {

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

std::string shader_log(GLuint s) {
  GLint n = 0;
  glGetShaderiv(s, GL_INFO_LOG_LENGTH, &n);
  std::string log(size_t(n > 1 ? n : 1), '\0');
  glGetShaderInfoLog(s, n, nullptr, log.data());
  return log.c_str();
}

std::string program_log(GLuint p) {
  GLint n = 0;
  glGetProgramiv(p, GL_INFO_LOG_LENGTH, &n);
  std::string log(size_t(n > 1 ? n : 1), '\0');
  glGetProgramInfoLog(p, n, nullptr, log.data());
  return log.c_str();
}

Expected<GLuint> compile(GLenum stage, const std::string& path) {
  const char* stage_name = stage == GL_VERTEX_SHADER ? "vertex" : "fragment";
  std::string src;
  if (!read_file(path, &src))
    return make_error("shader: cannot read ", stage_name, " shader '", path,
                      "' (is the shaders/ folder next to the executable?)");
  GLuint s = glCreateShader(stage);
  const char* p = src.c_str();
  glShaderSource(s, 1, &p, nullptr);
  glCompileShader(s);
  GLint ok = 0;
  glGetShaderiv(s, GL_COMPILE_STATUS, &ok);
  if (!ok) {
    std::string log = shader_log(s);
    glDeleteShader(s);
    return make_error("shader: ", stage_name, " stage of '", path, "' failed to compile:\n", log);
  }
  return s;
}

}  // namespace

Status load_gl(GlLoader loader) {
  if (!loader) return make_error("OpenGL: no loader function");
  int version = gladLoadGL(reinterpret_cast<GLADloadfunc>(loader));
  if (version == 0)
    return make_error("OpenGL: could not load any entry points (no current context?)");
  int major = GLAD_VERSION_MAJOR(version), minor = GLAD_VERSION_MINOR(version);
  if (major < 3 || (major == 3 && minor < 3))
    return make_error("OpenGL 3.3 core is required, but the driver offers ", major, ".", minor,
                      " (update the graphics driver, or run with LIBGL_ALWAYS_SOFTWARE=1)");
  return Status::Ok();
}

std::string gl_version_string() {
  const char* v = reinterpret_cast<const char*>(glGetString(GL_VERSION));
  const char* r = reinterpret_cast<const char*>(glGetString(GL_RENDERER));
  return std::string(v ? v : "?") + " / " + (r ? r : "?");
}

void gl_delete_buffer(unsigned id) {
  glDeleteBuffers(1, &id);
}
void gl_delete_vertex_array(unsigned id) {
  glDeleteVertexArrays(1, &id);
}
void gl_delete_texture(unsigned id) {
  glDeleteTextures(1, &id);
}
void gl_delete_framebuffer(unsigned id) {
  glDeleteFramebuffers(1, &id);
}
void gl_delete_renderbuffer(unsigned id) {
  glDeleteRenderbuffers(1, &id);
}
void gl_delete_program(unsigned id) {
  glDeleteProgram(id);
}

GlBuffer make_buffer() {
  GLuint id = 0;
  glGenBuffers(1, &id);
  return GlBuffer(id);
}
GlVertexArray make_vertex_array() {
  GLuint id = 0;
  glGenVertexArrays(1, &id);
  return GlVertexArray(id);
}
GlTexture make_texture() {
  GLuint id = 0;
  glGenTextures(1, &id);
  return GlTexture(id);
}

Expected<ShaderProgram> ShaderProgram::load(const std::string& dir, const std::string& name) {
  std::string vs_path = dir + "/" + name + ".vert", fs_path = dir + "/" + name + ".frag";
  Expected<GLuint> vs_or = compile(GL_VERTEX_SHADER, vs_path);
  if (!vs_or.ok()) return vs_or.error();
  Expected<GLuint> fs_or = compile(GL_FRAGMENT_SHADER, fs_path);
  if (!fs_or.ok()) {
    glDeleteShader(*vs_or);
    return fs_or.error();
  }
  GLuint vs = *vs_or, fs = *fs_or;
  GlProgramName prog(glCreateProgram());
  glAttachShader(prog.get(), vs);
  glAttachShader(prog.get(), fs);
  glLinkProgram(prog.get());
  glDeleteShader(vs);
  glDeleteShader(fs);
  GLint ok = 0;
  glGetProgramiv(prog.get(), GL_LINK_STATUS, &ok);
  if (!ok)
    return make_error("shader: program '", name, "' (", vs_path, " + ", fs_path,
                      ") failed to link:\n", program_log(prog.get()));
  ShaderProgram out;
  out.prog_ = std::move(prog);
  return out;
}

int ShaderProgram::uniform(const char* name) const {
  return glGetUniformLocation(prog_.get(), name);
}

void ShaderProgram::use() const {
  glUseProgram(prog_.get());
}

void clear_framebuffer(int width, int height, float r, float g, float b) {
  glViewport(0, 0, width, height);
  glDisable(GL_SCISSOR_TEST);
  glClearColor(r, g, b, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT | GL_DEPTH_BUFFER_BIT);
}

void finish() {
  glFinish();
}

std::string find_shader_dir(const std::string& exe_dir, const std::string& probe) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!exe_dir.empty()) {
    fs::path p = fs::path(exe_dir) / "shaders";
    if (fs::exists(p / probe, ec)) return p.string();
  }
#ifdef KVSCOPE_SHADER_SOURCE_DIR
  if (fs::exists(fs::path(KVSCOPE_SHADER_SOURCE_DIR) / probe, ec)) return KVSCOPE_SHADER_SOURCE_DIR;
#endif
  return "";
}

}  // namespace kvscope::render
