// renderer.cpp — GL state, instance packing and the per-frame draw sequence.
//
// Frame order: opaque (token blocks, KV blocks, head sphere) with depth writes, then
// blended layers without depth writes: grid (alpha), beams and halo (additive),
// labels (alpha, last so text stays readable over beams).
#include "render/renderer.h"

#include <glad/gl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>

#include <glm/gtc/type_ptr.hpp>

#include "render/camera.h"
#include "render/meshes.h"

namespace render {
namespace {

constexpr int kBeamSegments = 24;

struct BlockInstance {  // matches block.vert locations 2..4
  glm::vec3 center;
  glm::vec3 color;
  glm::vec4 params;  // brightness, recompute, highlight, unused
};
struct BeamInstance {  // beam.vert locations 0..3
  glm::vec3 from, to;
  float weight;
  glm::vec3 color;
};
struct GlyphInstance {  // glyph.vert locations 0..3
  glm::vec3 anchor;
  glm::vec4 rect, uv, color;
};

void float_attrib(GLuint loc, int n, GLsizei stride, size_t offset, bool per_instance) {
  glEnableVertexAttribArray(loc);
  glVertexAttribPointer(loc, n, GL_FLOAT, GL_FALSE, stride, reinterpret_cast<void*>(offset));
  glVertexAttribDivisor(loc, per_instance ? 1 : 0);
}

template <class T>
void upload(const GlBuffer& buf, const std::vector<T>& data) {
  glBindBuffer(GL_ARRAY_BUFFER, buf.get());
  // Orphan then fill: the driver need not wait for last frame's draw.
  glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(data.size() * sizeof(T)), nullptr, GL_STREAM_DRAW);
  if (!data.empty())
    glBufferSubData(GL_ARRAY_BUFFER, 0, GLsizeiptr(data.size() * sizeof(T)), data.data());
}

}  // namespace

struct Renderer::Impl {
  ShaderProgram block, head, halo, beam, glyph, grid;
  GlBuffer cube_vbo, sphere_vbo, sphere_ibo;
  GlBuffer token_inst, kv_inst, beam_inst, glyph_inst;
  GlVertexArray token_vao, kv_vao, sphere_vao, beam_vao, glyph_vao, empty_vao;
  GlTexture atlas_tex;
  GLsizei cube_count = 0, sphere_index_count = 0;
  std::vector<BlockInstance> token_data, kv_data;
  std::vector<BeamInstance> beam_data;
  std::vector<GlyphInstance> glyph_data;
  std::vector<GlyphQuad> quads;

  void setup_block_vao(const GlVertexArray& vao, const GlBuffer& inst) {
    glBindVertexArray(vao.get());
    glBindBuffer(GL_ARRAY_BUFFER, cube_vbo.get());
    float_attrib(0, 3, 6 * sizeof(float), 0, false);
    float_attrib(1, 3, 6 * sizeof(float), 3 * sizeof(float), false);
    glBindBuffer(GL_ARRAY_BUFFER, inst.get());
    float_attrib(2, 3, sizeof(BlockInstance), offsetof(BlockInstance, center), true);
    float_attrib(3, 3, sizeof(BlockInstance), offsetof(BlockInstance, color), true);
    float_attrib(4, 4, sizeof(BlockInstance), offsetof(BlockInstance, params), true);
  }
};

Renderer::~Renderer() = default;

Result Renderer::create(const RendererOptions& opts, std::unique_ptr<Renderer>* out) {
  if (opts.shader_dir.empty())
    return Result::fail("renderer: shader folder not found (expected shaders/ next to the executable)");
  std::unique_ptr<Renderer> r(new Renderer());
  r->impl_ = std::make_unique<Impl>();
  Impl& m = *r->impl_;
  const std::pair<const char*, ShaderProgram*> programs[] = {
      {"block", &m.block}, {"head", &m.head},   {"halo", &m.halo},
      {"beam", &m.beam},   {"glyph", &m.glyph}, {"grid", &m.grid}};
  for (auto& [name, prog] : programs)
    if (Result res = ShaderProgram::load(opts.shader_dir, name, prog); !res.ok()) return res;

  std::string font = opts.font_path.empty() ? GlyphAtlas::find_default_font() : opts.font_path;
  if (Result res = GlyphAtlas::bake(font, opts.font_pixels, 1024, &r->atlas_); !res.ok()) return res;

  // Static meshes.
  MeshData cube = make_cube(), sphere = make_sphere(32, 20);
  m.cube_count = GLsizei(cube.vertices.size() / 6);
  m.sphere_index_count = GLsizei(sphere.indices.size());
  m.cube_vbo = make_buffer();
  glBindBuffer(GL_ARRAY_BUFFER, m.cube_vbo.get());
  glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(cube.vertices.size() * sizeof(float)),
               cube.vertices.data(), GL_STATIC_DRAW);
  for (GlBuffer* b : {&m.token_inst, &m.kv_inst, &m.beam_inst, &m.glyph_inst}) *b = make_buffer();
  for (GlVertexArray* v : {&m.token_vao, &m.kv_vao, &m.sphere_vao, &m.beam_vao, &m.glyph_vao,
                           &m.empty_vao})
    *v = make_vertex_array();
  m.setup_block_vao(m.token_vao, m.token_inst);
  m.setup_block_vao(m.kv_vao, m.kv_inst);

  glBindVertexArray(m.sphere_vao.get());
  m.sphere_vbo = make_buffer();
  m.sphere_ibo = make_buffer();
  glBindBuffer(GL_ARRAY_BUFFER, m.sphere_vbo.get());
  glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(sphere.vertices.size() * sizeof(float)),
               sphere.vertices.data(), GL_STATIC_DRAW);
  glBindBuffer(GL_ELEMENT_ARRAY_BUFFER, m.sphere_ibo.get());
  glBufferData(GL_ELEMENT_ARRAY_BUFFER, GLsizeiptr(sphere.indices.size() * sizeof(uint32_t)),
               sphere.indices.data(), GL_STATIC_DRAW);
  float_attrib(0, 3, 6 * sizeof(float), 0, false);

  glBindVertexArray(m.beam_vao.get());
  glBindBuffer(GL_ARRAY_BUFFER, m.beam_inst.get());
  float_attrib(0, 3, sizeof(BeamInstance), offsetof(BeamInstance, from), true);
  float_attrib(1, 3, sizeof(BeamInstance), offsetof(BeamInstance, to), true);
  float_attrib(2, 1, sizeof(BeamInstance), offsetof(BeamInstance, weight), true);
  float_attrib(3, 3, sizeof(BeamInstance), offsetof(BeamInstance, color), true);

  glBindVertexArray(m.glyph_vao.get());
  glBindBuffer(GL_ARRAY_BUFFER, m.glyph_inst.get());
  float_attrib(0, 3, sizeof(GlyphInstance), offsetof(GlyphInstance, anchor), true);
  float_attrib(1, 4, sizeof(GlyphInstance), offsetof(GlyphInstance, rect), true);
  float_attrib(2, 4, sizeof(GlyphInstance), offsetof(GlyphInstance, uv), true);
  float_attrib(3, 4, sizeof(GlyphInstance), offsetof(GlyphInstance, color), true);
  glBindVertexArray(0);

  // Glyph atlas texture (R8, mipmapped so small distant labels do not shimmer).
  m.atlas_tex = make_texture();
  glBindTexture(GL_TEXTURE_2D, m.atlas_tex.get());
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  int n = r->atlas_.size();
  glTexImage2D(GL_TEXTURE_2D, 0, GL_R8, n, n, 0, GL_RED, GL_UNSIGNED_BYTE, r->atlas_.pixels().data());
  glGenerateMipmap(GL_TEXTURE_2D);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR_MIPMAP_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
  glBindTexture(GL_TEXTURE_2D, 0);

  if (GLenum e = glGetError(); e != GL_NO_ERROR)
    return Result::fail("renderer: OpenGL error 0x" + std::to_string(e) + " while creating resources");
  *out = std::move(r);
  return {};
}

void Renderer::draw(const Scene& scene, int width, int height) {
  auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  stats_ = FrameStats{};
  if (width <= 0 || height <= 0) return;

  // ---- pack instances ----
  m.token_data.clear();
  for (const TokenInstance& t : scene.tokens)
    m.token_data.push_back({t.position, t.color, {t.brightness, 0.0f, t.highlighted ? 1.0f : 0.0f, 0.0f}});
  m.kv_data.clear();
  for (const KvBlockInstance& k : scene.kv_blocks)
    m.kv_data.push_back({k.position, k.color, {k.brightness, k.recompute, 0.0f, 0.0f}});
  m.beam_data.clear();
  for (const Beam& b : scene.beams) {
    float w = std::clamp(b.weight, 0.0f, 1.0f);
    if (w < 0.004f) continue;  // invisible anyway
    m.beam_data.push_back({b.from, b.to, w, b.color});
  }
  m.glyph_data.clear();
  float center_y = atlas_.descent() + 0.5f;  // middle of a text line
  for (const TokenInstance& t : scene.tokens) {
    if (t.label.empty()) continue;
    m.quads.clear();
    float width_units = atlas_.layout(t.label, &m.quads);
    glm::vec3 anchor = t.position + glm::vec3(0.0f, 0.5f * scene.token_size.y + 0.12f, 0.0f);
    float shade = 0.6f + 0.4f * std::clamp(t.brightness, 0.0f, 1.0f);
    glm::vec4 color = t.highlighted ? glm::vec4(1.0f, 0.92f, 0.45f, 1.0f)
                                    : glm::vec4(glm::vec3(0.95f * shade), 1.0f);
    float dx = scene.labels_vertical ? 0.0f : -0.5f * width_units;
    float dy = scene.labels_vertical ? -center_y : 0.0f;
    for (const GlyphQuad& q : m.quads)
      m.glyph_data.push_back({anchor,
                              {q.x0 + dx, q.y0 + dy, q.x1 + dx, q.y1 + dy},
                              {q.u0, q.v0, q.u1, q.v1},
                              color});
  }

  // ---- frame state ----
  const CameraView& cam = scene.camera;
  float aspect = float(width) / float(height);
  glm::mat4 view = view_matrix(cam), proj = projection_matrix(cam, aspect);
  glm::mat4 vp = proj * view;

  glViewport(0, 0, width, height);
  glClearColor(scene.background.r, scene.background.g, scene.background.b, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT | GL_DEPTH_BUFFER_BIT);
  glEnable(GL_DEPTH_TEST);
  glDepthFunc(GL_LEQUAL);
  glDepthMask(GL_TRUE);
  glDisable(GL_BLEND);
  glDisable(GL_CULL_FACE);

  auto draw_blocks = [&](const GlVertexArray& vao, const GlBuffer& inst,
                         const std::vector<BlockInstance>& data, glm::vec3 size) {
    if (data.empty()) return;
    upload(inst, data);
    m.block.use();
    glUniformMatrix4fv(m.block.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(vp));
    glUniform3fv(m.block.uniform("u_size"), 1, glm::value_ptr(size));
    glUniform3fv(m.block.uniform("u_eye"), 1, glm::value_ptr(cam.eye));
    glBindVertexArray(vao.get());
    glDrawArraysInstanced(GL_TRIANGLES, 0, m.cube_count, GLsizei(data.size()));
    ++stats_.draw_calls;
  };
  draw_blocks(m.token_vao, m.token_inst, m.token_data, scene.token_size);
  draw_blocks(m.kv_vao, m.kv_inst, m.kv_data, scene.kv_block_size);

  if (scene.head.visible) {
    m.head.use();
    glUniformMatrix4fv(m.head.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(vp));
    glUniform3fv(m.head.uniform("u_center"), 1, glm::value_ptr(scene.head.position));
    glUniform1f(m.head.uniform("u_radius"), scene.head.radius);
    glUniform3fv(m.head.uniform("u_eye"), 1, glm::value_ptr(cam.eye));
    glUniform3fv(m.head.uniform("u_color"), 1, glm::value_ptr(scene.head.color));
    glBindVertexArray(m.sphere_vao.get());
    glDrawElements(GL_TRIANGLES, m.sphere_index_count, GL_UNSIGNED_INT, nullptr);
    ++stats_.draw_calls;
  }

  // ---- blended layers ----
  glEnable(GL_BLEND);
  glDepthMask(GL_FALSE);

  if (scene.grid.visible) {
    glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
    float x0 = -8.0f, x1 = 8.0f, z0 = -10.0f, z1 = 10.0f;
    for (const TokenInstance& t : scene.tokens) {
      x0 = std::min(x0, t.position.x - 8.0f);
      x1 = std::max(x1, t.position.x + 8.0f);
    }
    x1 = std::max(x1, scene.head.position.x + 8.0f);
    m.grid.use();
    glUniformMatrix4fv(m.grid.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(vp));
    glUniform4f(m.grid.uniform("u_extent"), x0, z0, x1, z1);
    glUniform1f(m.grid.uniform("u_height"), scene.grid.height);
    glUniform1f(m.grid.uniform("u_spacing"), scene.grid.spacing);
    glUniform3fv(m.grid.uniform("u_color"), 1, glm::value_ptr(scene.grid.color));
    glBindVertexArray(m.empty_vao.get());
    glDrawArrays(GL_TRIANGLE_STRIP, 0, 4);
    ++stats_.draw_calls;
  }

  glBlendFunc(GL_ONE, GL_ONE);  // additive: beams and glow only ever add light
  if (!m.beam_data.empty()) {
    upload(m.beam_inst, m.beam_data);
    m.beam.use();
    glUniformMatrix4fv(m.beam.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(vp));
    glUniform3fv(m.beam.uniform("u_eye"), 1, glm::value_ptr(cam.eye));
    glUniform1i(m.beam.uniform("u_segments"), kBeamSegments);
    glUniform1f(m.beam.uniform("u_width"), 0.09f);
    glBindVertexArray(m.beam_vao.get());
    glDrawArraysInstanced(GL_TRIANGLE_STRIP, 0, 2 * (kBeamSegments + 1), GLsizei(m.beam_data.size()));
    ++stats_.draw_calls;
  }
  if (scene.head.visible && scene.head.glow > 0.0f) {
    m.halo.use();
    glUniformMatrix4fv(m.halo.uniform("u_view"), 1, GL_FALSE, glm::value_ptr(view));
    glUniformMatrix4fv(m.halo.uniform("u_proj"), 1, GL_FALSE, glm::value_ptr(proj));
    glUniform3fv(m.halo.uniform("u_center"), 1, glm::value_ptr(scene.head.position));
    glUniform1f(m.halo.uniform("u_size"), scene.head.radius * 4.0f);
    glUniform3fv(m.halo.uniform("u_color"), 1, glm::value_ptr(scene.head.color));
    glUniform1f(m.halo.uniform("u_glow"), std::clamp(scene.head.glow, 0.0f, 1.0f));
    glBindVertexArray(m.empty_vao.get());
    glDrawArrays(GL_TRIANGLE_STRIP, 0, 4);
    ++stats_.draw_calls;
  }

  if (!m.glyph_data.empty()) {
    glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
    upload(m.glyph_inst, m.glyph_data);
    m.glyph.use();
    glUniformMatrix4fv(m.glyph.uniform("u_view"), 1, GL_FALSE, glm::value_ptr(view));
    glUniformMatrix4fv(m.glyph.uniform("u_proj"), 1, GL_FALSE, glm::value_ptr(proj));
    glUniform1f(m.glyph.uniform("u_height"), scene.label_height);
    glUniform1i(m.glyph.uniform("u_vertical"), scene.labels_vertical ? 1 : 0);
    glUniform2f(m.glyph.uniform("u_texel"), 1.0f / atlas_.size(), 1.0f / atlas_.size());
    glActiveTexture(GL_TEXTURE0);
    glBindTexture(GL_TEXTURE_2D, m.atlas_tex.get());
    glUniform1i(m.glyph.uniform("u_atlas"), 0);
    glBindVertexArray(m.glyph_vao.get());
    glDrawArraysInstanced(GL_TRIANGLE_STRIP, 0, 4, GLsizei(m.glyph_data.size()));
    ++stats_.draw_calls;
  }

  glBindVertexArray(0);
  glDepthMask(GL_TRUE);
  glDisable(GL_BLEND);
  glUseProgram(0);

  stats_.tokens = m.token_data.size();
  stats_.kv_blocks = m.kv_data.size();
  stats_.beams = m.beam_data.size();
  stats_.glyphs = m.glyph_data.size();
  stats_.cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace render
