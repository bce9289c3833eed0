// renderer.cpp — GL state, instance packing and the per-frame draw sequence.
//
// Frame order: opaque (token blocks, KV blocks, head sphere) with depth writes, then
// blended layers without depth writes: grid (alpha), beams and halo (additive),
// labels (alpha, last so text stays readable over beams).
// Only the instances in view are drawn: tokens, KV blocks and labels lie in x order, so
// what the frustum holds is one contiguous range of each (found by testing each token's
// column against the frustum), drawn by pointing the instance attributes at its start.
// Instance buffers are uploaded only when the content changed: a Scene with the revision
// of the last upload reuses them outright; otherwise the freshly packed instances are
// compared with the previous ones and only the changed byte range is sent. Animation is
// uniforms (SceneAnim).
#include "render/renderer.h"

#include <glad/gl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <limits>
#include <utility>

#include <glm/gtc/type_ptr.hpp>

#include "render/camera.h"
#include "render/frustum.h"
#include "render/meshes.h"

namespace kvscope::render {
namespace {

constexpr int kBeamSegments = 24;
constexpr float kBeamWidth = 0.09f;  // world units, at the weakest weight (beam.vert)
// Beams to tokens out of view drawn at most (the strongest of each stretch of the sequence).
constexpr size_t kOffViewBeams = 96;

struct BlockInstance {  // matches block.vert locations 2..6
  glm::vec3 center;
  glm::vec3 color;
  glm::vec4 params;  // brightness, recompute, highlight, flash gain (white)
  glm::vec3 anim;    // flash gain (brightness), flash gain (recompute), drop
  glm::vec4 style;   // leave, hatch K, hatch V, slide
};
struct MarkerGpu {  // marker.vert locations 2..4
  glm::vec3 center, size, color;
};
struct BeamInstance {  // beam.vert locations 0..3
  glm::vec3 from, to;
  float weight;
  glm::vec3 color;
};
struct GlyphInstance {  // glyph.vert locations 0..6
  glm::vec3 anchor;
  glm::vec4 rect, uv, color;
  float drop;
  float min_px;
  glm::vec2 extra;  // flat, slide
};

void float_attrib(GLuint loc, int n, GLsizei stride, size_t offset, bool per_instance) {
  glEnableVertexAttribArray(loc);
  glVertexAttribPointer(loc, n, GL_FLOAT, GL_FALSE, stride, reinterpret_cast<void*>(offset));
  glVertexAttribDivisor(loc, per_instance ? 1 : 0);
}

// Sends `data` to `buf`, which holds `prev` (what was sent last time): the whole buffer
// when the size changed, else only the byte range that differs (nothing if none).
// Returns the bytes sent. Afterwards *prev holds the new content (data is left stale).
template <class T>
size_t upload_changes(const GlBuffer& buf, std::vector<T>& data, std::vector<T>* prev) {
  const size_t bytes = data.size() * sizeof(T);
  const auto* a = reinterpret_cast<const unsigned char*>(data.data());
  const auto* b = reinterpret_cast<const unsigned char*>(prev->data());
  size_t sent = 0;
  if (data.size() != prev->size()) {
    glBindBuffer(GL_ARRAY_BUFFER, buf.get());
    glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(bytes), data.empty() ? nullptr : data.data(),
                 GL_DYNAMIC_DRAW);
    sent = bytes;
  } else if (bytes > 0) {
    size_t lo = 0, hi = bytes;
    while (lo < bytes && a[lo] == b[lo]) ++lo;
    if (lo < bytes) {
      while (hi > lo && a[hi - 1] == b[hi - 1]) --hi;
      glBindBuffer(GL_ARRAY_BUFFER, buf.get());
      glBufferSubData(GL_ARRAY_BUFFER, GLintptr(lo), GLsizeiptr(hi - lo), a + lo);
      sent = hi - lo;
    }
  }
  std::swap(*prev, data);
  return sent;
}

}  // namespace

// One frame's camera: the matrices every pass uses, and the view's height in pixels.
struct FrameView {
  const Scene& scene;
  glm::mat4 view, proj, vp;
  int height = 0;
};

// The instance ranges in view (all of them when the content is not x-sorted), and the
// x span whose beams are drawn as ribbons (the others are hairlines, a level of detail).
struct VisibleRanges {
  InstanceRange tok, kv, glyph;
  float wide_x0 = -std::numeric_limits<float>::max();
  float wide_x1 = std::numeric_limits<float>::max();
};

struct Renderer::Impl {
  ShaderProgram block, head, halo, beam, glyph, grid, marker;
  GlBuffer cube_vbo, sphere_vbo, sphere_ibo;
  GlBuffer token_inst, kv_inst, beam_inst, glyph_inst, marker_inst, beam_lod_inst;
  GlVertexArray token_vao, kv_vao, sphere_vao, beam_vao, glyph_vao, empty_vao, marker_vao,
      beam_lod_vao;
  GlTexture atlas_tex;
  GLsizei cube_count = 0, sphere_index_count = 0;
  std::vector<BlockInstance> token_data, kv_data;
  std::vector<BeamInstance> beam_data;
  std::vector<GlyphInstance> glyph_data;
  std::vector<MarkerGpu> marker_data;
  // What the GPU buffers hold now (for the changed-range upload).
  std::vector<BlockInstance> token_gpu, kv_gpu;
  std::vector<BeamInstance> beam_gpu;
  // Level of detail for the beams (see draw): what beam_lod_inst holds, and for which
  // content and range of beams in view it was made.
  std::vector<BeamInstance> beam_lod;
  uint64_t packs = 0, beam_lod_pack = 0;  // pack() calls so far; the one beam_lod was made after
  size_t beam_lod_first = 0, beam_lod_end = 0;
  bool beams_sorted = false;  // beams in non-decreasing target x (the app's order)
  std::vector<GlyphInstance> glyph_gpu;
  std::vector<MarkerGpu> marker_gpu;
  std::vector<GlyphQuad> quads;
  uint64_t revision = 0;                  // Scene::revision of the buffers' content (0: none)
  float grid_x0 = -8.0f, grid_x1 = 8.0f;  // token extent of that content
  // Tokens, KV blocks and glyphs are each in non-decreasing x (the app's layout): the
  // part in view is then one contiguous range of each, and only that range is drawn.
  bool x_sorted = false;

  void pack(const Scene& scene, const GlyphAtlas& atlas);

  void setup_block_vao(const GlVertexArray& vao, const GlBuffer& inst) {
    glBindVertexArray(vao.get());
    glBindBuffer(GL_ARRAY_BUFFER, cube_vbo.get());
    float_attrib(0, 3, 6 * sizeof(float), 0, false);
    float_attrib(1, 3, 6 * sizeof(float), 3 * sizeof(float), false);
    bind_block_instances(vao, inst, 0);
  }
  // Points the per-instance attributes at instance `first` (drawing a sub-range without
  // GL 4.2's base instance).
  void bind_block_instances(const GlVertexArray& vao, const GlBuffer& inst, size_t first) {
    const size_t base = first * sizeof(BlockInstance);
    glBindVertexArray(vao.get());
    glBindBuffer(GL_ARRAY_BUFFER, inst.get());
    float_attrib(2, 3, sizeof(BlockInstance), base + offsetof(BlockInstance, center), true);
    float_attrib(3, 3, sizeof(BlockInstance), base + offsetof(BlockInstance, color), true);
    float_attrib(4, 4, sizeof(BlockInstance), base + offsetof(BlockInstance, params), true);
    float_attrib(5, 3, sizeof(BlockInstance), base + offsetof(BlockInstance, anim), true);
    float_attrib(6, 4, sizeof(BlockInstance), base + offsetof(BlockInstance, style), true);
  }
  // Beams [first, end) as they are, the ones before and after them thinned to at most
  // kOffViewBeams in all: each stretch of equal x span keeps its strongest beam.
  void make_beam_lod(size_t first, size_t end);
  // The parts of a frame, in drawing order; each counts its draw calls in `st`.
  VisibleRanges visible_ranges(const Scene& scene, const glm::mat4& vp) const;
  void draw_blocks(const FrameView& f, const GlVertexArray& vao, const GlBuffer& inst,
                   InstanceRange range, glm::vec3 size, FrameStats& st);
  void draw_markers(const FrameView& f, FrameStats& st);
  void draw_head(const FrameView& f, FrameStats& st);
  void draw_grid(const FrameView& f, FrameStats& st);
  void draw_beams(const FrameView& f, float wide_x0, float wide_x1, FrameStats& st);
  void draw_halo(const FrameView& f, FrameStats& st);
  void draw_glyphs(const FrameView& f, InstanceRange range, const GlyphAtlas& atlas,
                   FrameStats& st);
  void bind_glyph_instances(size_t first) {
    const size_t base = first * sizeof(GlyphInstance);
    glBindVertexArray(glyph_vao.get());
    glBindBuffer(GL_ARRAY_BUFFER, glyph_inst.get());
    float_attrib(0, 3, sizeof(GlyphInstance), base + offsetof(GlyphInstance, anchor), true);
    float_attrib(1, 4, sizeof(GlyphInstance), base + offsetof(GlyphInstance, rect), true);
    float_attrib(2, 4, sizeof(GlyphInstance), base + offsetof(GlyphInstance, uv), true);
    float_attrib(3, 4, sizeof(GlyphInstance), base + offsetof(GlyphInstance, color), true);
    float_attrib(4, 1, sizeof(GlyphInstance), base + offsetof(GlyphInstance, drop), true);
    float_attrib(5, 1, sizeof(GlyphInstance), base + offsetof(GlyphInstance, min_px), true);
    float_attrib(6, 2, sizeof(GlyphInstance), base + offsetof(GlyphInstance, extra), true);
  }
};

void Renderer::Impl::pack(const Scene& scene, const GlyphAtlas& atlas) {
  // Exact sizes: these vectors hold the previous content's capacity (upload_changes swaps
  // them with what the GPU holds), and growing one by doubling would copy it (25 MB of KV
  // blocks at 4,096 positions with 3 KV heads) into a block twice as large.
  token_data.clear();
  token_data.reserve(scene.tokens.size());
  grid_x0 = -8.0f;
  grid_x1 = 8.0f;
  for (const TokenInstance& t : scene.tokens) {
    token_data.push_back({t.position,
                          t.color,
                          {t.brightness, 0.0f, t.highlighted ? 1.0f : 0.0f, 0.0f},
                          {0.0f, 0.0f, t.drop},
                          {t.leave, 0.0f, 0.0f, t.slide}});
    grid_x0 = std::min(grid_x0, t.position.x - 8.0f);
    grid_x1 = std::max(grid_x1, t.position.x + 8.0f);
  }
  kv_data.clear();
  kv_data.reserve(scene.kv_blocks.size());
  for (const KvBlockInstance& k : scene.kv_blocks)
    kv_data.push_back({k.position,
                       k.color,
                       {k.brightness, k.recompute, k.highlight, k.flash_white},
                       {k.flash_brightness, k.flash_recompute, 0.0f},
                       {k.leave, k.hatch_k, k.hatch_v, k.slide}});
  marker_data.clear();
  for (const MarkerInstance& mk : scene.markers)
    marker_data.push_back({mk.center, mk.size, mk.color});
  auto sorted = [](const auto& v, auto x_of) {
    for (size_t i = 1; i < v.size(); ++i)
      if (x_of(v[i]) < x_of(v[i - 1])) return false;
    return true;
  };
  x_sorted = sorted(token_data, [](const BlockInstance& b) { return b.center.x; }) &&
             sorted(kv_data, [](const BlockInstance& b) { return b.center.x; });
  beam_data.clear();
  beam_data.reserve(scene.beams.size());
  for (const Beam& b : scene.beams) {
    float w = std::clamp(b.weight, 0.0f, 1.0f);
    if (w < 0.004f) continue;  // invisible anyway
    beam_data.push_back({b.from, b.to, w, b.color});
  }
  beams_sorted = sorted(beam_data, [](const BeamInstance& b) { return b.to.x; });
  ++packs;
  glyph_data.clear();
  float center_y = atlas.descent() + 0.5f;  // middle of a text line
  for (const TokenInstance& t : scene.tokens) {
    if (t.label.empty()) continue;
    quads.clear();
    float width_units = atlas.layout(t.label, &quads);
    glm::vec3 anchor = t.position + glm::vec3(0.0f, 0.5f * scene.token_size.y + 0.12f, 0.0f);
    float shade = 0.6f + 0.4f * std::clamp(t.brightness, 0.0f, 1.0f);
    glm::vec4 color = t.highlighted ? glm::vec4(1.0f, 0.92f, 0.45f, 1.0f)
                                    : glm::vec4(glm::vec3(0.95f * shade), 1.0f);
    float dx = scene.labels_vertical ? 0.0f : -0.5f * width_units;
    float dy = scene.labels_vertical ? -center_y : 0.0f;
    if (t.label_flat) {
      // Centered under the token's near edge, the line's top one gap below it, per lane.
      anchor = t.position + glm::vec3(0.0f, 0.5f * scene.token_size.y, 0.5f * scene.token_size.z);
      dx = -0.5f * width_units;
      dy = -(1.0f + atlas.descent()) - kFlatLabelGap - kFlatLabelLane * float(t.label_lane);
    }
    for (const GlyphQuad& q : quads)
      glyph_data.push_back({anchor,
                            {q.x0 + dx, q.y0 + dy, q.x1 + dx, q.y1 + dy},
                            {q.u0, q.v0, q.u1, q.v1},
                            color,
                            t.drop,
                            t.highlighted ? std::max(t.label_min_px, 16.0f) : t.label_min_px,
                            {t.label_flat ? 1.0f : 0.0f, t.slide}});
  }
  x_sorted = x_sorted && sorted(glyph_data, [](const GlyphInstance& g) { return g.anchor.x; });
}

const char* pass_name(Pass p) {
  static const char* const kNames[kPassCount] = {"prepare", "clear", "tokens", "kv",   "markers",
                                                 "head",    "grid",  "beams",  "halo", "glyphs"};
  return kNames[static_cast<int>(p)];
}

void Renderer::Impl::make_beam_lod(size_t first, size_t end) {
  const size_t n = beam_gpu.size(), off = first + (n - end);
  beam_lod.clear();
  auto thin = [&](size_t a, size_t b) {
    if (b <= a) return;
    const size_t buckets = std::max<size_t>(1, kOffViewBeams * (b - a) / std::max<size_t>(off, 1));
    const float x0 = beam_gpu[a].to.x, span = beam_gpu[b - 1].to.x - x0;
    size_t at = a;
    for (size_t k = 0; k < buckets && at < b; ++k) {
      const float until = x0 + span * float(k + 1) / float(buckets);
      size_t best = at;
      for (; at < b && (beam_gpu[at].to.x <= until || k + 1 == buckets); ++at)
        if (beam_gpu[at].weight > beam_gpu[best].weight) best = at;
      if (best < at) beam_lod.push_back(beam_gpu[best]);
    }
  };
  thin(0, first);
  beam_lod.insert(beam_lod.end(), beam_gpu.begin() + long(first), beam_gpu.begin() + long(end));
  thin(end, n);
}

uint64_t next_scene_revision() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

Renderer::~Renderer() = default;

Expected<std::unique_ptr<Renderer>> Renderer::create(const RendererOptions& opts) {
  if (opts.shader_dir.empty())
    return make_error(
        "renderer: shader folder not found (expected shaders/ next to the executable)");
  std::unique_ptr<Renderer> r(new Renderer());
  r->impl_ = std::make_unique<Impl>();
  Impl& m = *r->impl_;
  const std::pair<const char*, ShaderProgram*> programs[] = {
      {"block", &m.block}, {"head", &m.head}, {"halo", &m.halo},    {"beam", &m.beam},
      {"glyph", &m.glyph}, {"grid", &m.grid}, {"marker", &m.marker}};
  for (auto& [name, prog] : programs) {
    Expected<ShaderProgram> loaded = ShaderProgram::load(opts.shader_dir, name);
    if (!loaded.ok()) return loaded.error();
    *prog = std::move(loaded).value();
  }

  std::string font = opts.font_path.empty() ? GlyphAtlas::find_default_font() : opts.font_path;
  Expected<GlyphAtlas> atlas = GlyphAtlas::bake(font, opts.font_pixels, 1024);
  if (!atlas.ok()) return atlas.error();
  r->atlas_ = std::move(atlas).value();

  // Static meshes.
  MeshData cube = make_cube(), sphere = make_sphere(32, 20);
  m.cube_count = GLsizei(cube.vertices.size() / 6);
  m.sphere_index_count = GLsizei(sphere.indices.size());
  m.cube_vbo = make_buffer();
  glBindBuffer(GL_ARRAY_BUFFER, m.cube_vbo.get());
  glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(cube.vertices.size() * sizeof(float)),
               cube.vertices.data(), GL_STATIC_DRAW);
  for (GlBuffer* b : {&m.token_inst, &m.kv_inst, &m.beam_inst, &m.glyph_inst, &m.marker_inst})
    *b = make_buffer();
  for (GlVertexArray* v : {&m.token_vao, &m.kv_vao, &m.sphere_vao, &m.beam_vao, &m.glyph_vao,
                           &m.empty_vao, &m.marker_vao})
    *v = make_vertex_array();
  m.setup_block_vao(m.token_vao, m.token_inst);
  m.setup_block_vao(m.kv_vao, m.kv_inst);
  glBindVertexArray(m.marker_vao.get());
  glBindBuffer(GL_ARRAY_BUFFER, m.cube_vbo.get());
  float_attrib(0, 3, 6 * sizeof(float), 0, false);
  float_attrib(1, 3, 6 * sizeof(float), 3 * sizeof(float), false);
  glBindBuffer(GL_ARRAY_BUFFER, m.marker_inst.get());
  float_attrib(2, 3, sizeof(MarkerGpu), offsetof(MarkerGpu, center), true);
  float_attrib(3, 3, sizeof(MarkerGpu), offsetof(MarkerGpu, size), true);
  float_attrib(4, 3, sizeof(MarkerGpu), offsetof(MarkerGpu, color), true);

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

  m.beam_lod_inst = make_buffer();
  m.beam_lod_vao = make_vertex_array();
  for (auto [vao, inst] :
       {std::pair{&m.beam_vao, &m.beam_inst}, {&m.beam_lod_vao, &m.beam_lod_inst}}) {
    glBindVertexArray(vao->get());
    glBindBuffer(GL_ARRAY_BUFFER, inst->get());
    float_attrib(0, 3, sizeof(BeamInstance), offsetof(BeamInstance, from), true);
    float_attrib(1, 3, sizeof(BeamInstance), offsetof(BeamInstance, to), true);
    float_attrib(2, 1, sizeof(BeamInstance), offsetof(BeamInstance, weight), true);
    float_attrib(3, 3, sizeof(BeamInstance), offsetof(BeamInstance, color), true);
  }

  glBindVertexArray(m.glyph_vao.get());
  glBindBuffer(GL_ARRAY_BUFFER, m.glyph_inst.get());
  float_attrib(0, 3, sizeof(GlyphInstance), offsetof(GlyphInstance, anchor), true);
  float_attrib(1, 4, sizeof(GlyphInstance), offsetof(GlyphInstance, rect), true);
  float_attrib(2, 4, sizeof(GlyphInstance), offsetof(GlyphInstance, uv), true);
  float_attrib(3, 4, sizeof(GlyphInstance), offsetof(GlyphInstance, color), true);
  float_attrib(4, 1, sizeof(GlyphInstance), offsetof(GlyphInstance, drop), true);
  float_attrib(5, 1, sizeof(GlyphInstance), offsetof(GlyphInstance, min_px), true);
  float_attrib(6, 2, sizeof(GlyphInstance), offsetof(GlyphInstance, extra), true);
  glBindVertexArray(0);

  // Glyph atlas texture (R8, mipmapped so small distant labels do not shimmer).
  m.atlas_tex = make_texture();
  glBindTexture(GL_TEXTURE_2D, m.atlas_tex.get());
  glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
  int n = r->atlas_.size();
  glTexImage2D(GL_TEXTURE_2D, 0, GL_R8, n, n, 0, GL_RED, GL_UNSIGNED_BYTE,
               r->atlas_.pixels().data());
  glGenerateMipmap(GL_TEXTURE_2D);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR_MIPMAP_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
  glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
  glBindTexture(GL_TEXTURE_2D, 0);

  if (GLenum e = glGetError(); e != GL_NO_ERROR)
    return make_error("renderer: OpenGL error 0x" + std::to_string(e) +
                        " while creating resources");
  return r;
}

VisibleRanges Renderer::Impl::visible_ranges(const Scene& scene, const glm::mat4& vp) const {
  VisibleRanges r;
  r.tok = {0, token_gpu.size()};
  r.kv = {0, kv_gpu.size()};
  r.glyph = {0, glyph_gpu.size()};
  if (!x_sorted || !(scene.cull_offscreen || scene.beam_lod) || token_gpu.empty()) return r;
  const auto planes = frustum_planes(vp);
  const float pad = 0.5f * std::max({scene.token_size.x, scene.token_size.z, 1.0f});
  const float y_floor = std::min(scene.grid.height, -1.0f);
  long lo = -1, hi = -1;
  for (size_t i = 0; i < token_gpu.size(); ++i) {
    // A token's column: its KV stack down to the floor, its label and drop above.
    const BlockInstance& t = token_gpu[i];
    glm::vec3 a{t.center.x - pad, y_floor, t.center.z - pad};
    glm::vec3 b{t.center.x + pad, t.center.y + scene.token_size.y + 8.0f + t.anim.z,
                t.center.z + pad};
    if (box_visible(planes, a, b)) {
      if (lo < 0) lo = long(i);
      hi = long(i);
    }
  }
  if (lo < 0) {
    if (scene.cull_offscreen) r.tok = r.kv = r.glyph = InstanceRange{};
    if (scene.beam_lod) {
      r.wide_x0 = 1.0f;
      r.wide_x1 = 0.0f;
    }
    return r;
  }
  const float x0 = token_gpu[size_t(lo)].center.x - pad, x1 = token_gpu[size_t(hi)].center.x + pad;
  if (scene.cull_offscreen) {
    r.tok = {size_t(lo), size_t(hi - lo + 1)};
    r.kv = x_range(kv_gpu, x0, x1, [](const BlockInstance& k) { return k.center.x; });
    r.glyph = x_range(glyph_gpu, x0, x1, [](const GlyphInstance& g) { return g.anchor.x; });
  }
  if (scene.beam_lod) {
    r.wide_x0 = x0;
    r.wide_x1 = x1;
  }
  return r;
}

void Renderer::Impl::draw_blocks(const FrameView& f, const GlVertexArray& vao,
                                 const GlBuffer& inst, InstanceRange range, glm::vec3 size,
                                 FrameStats& st) {
  if (range.count == 0) return;
  const SceneAnim& anim = f.scene.anim;
  block.use();
  glUniform1f(block.uniform("u_flash"), std::clamp(anim.flash, 0.0f, 1.0f));
  glUniform1f(block.uniform("u_fall"), std::clamp(anim.fall, 0.0f, 1.0f));
  glUniform1f(block.uniform("u_leave"), std::clamp(anim.leave, 0.0f, 1.0f));
  glUniform1f(block.uniform("u_slide"), std::clamp(anim.slide, 0.0f, 1.0f));
  glUniformMatrix4fv(block.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(f.vp));
  glUniform3fv(block.uniform("u_size"), 1, glm::value_ptr(size));
  glUniform3fv(block.uniform("u_eye"), 1, glm::value_ptr(f.scene.camera.eye));
  glUniform1f(block.uniform("u_haze"), std::clamp(f.scene.haze, 0.0f, 1.0f));
  bind_block_instances(vao, inst, range.first);
  glDrawArraysInstanced(GL_TRIANGLES, 0, cube_count, GLsizei(range.count));
  ++st.draw_calls;
}

void Renderer::Impl::draw_markers(const FrameView& f, FrameStats& st) {
  if (marker_gpu.empty()) return;
  marker.use();
  glUniformMatrix4fv(marker.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(f.vp));
  glBindVertexArray(marker_vao.get());
  glDrawArraysInstanced(GL_TRIANGLES, 0, cube_count, GLsizei(marker_gpu.size()));
  ++st.draw_calls;
}

void Renderer::Impl::draw_head(const FrameView& f, FrameStats& st) {
  const auto& h = f.scene.head;
  if (!h.visible) return;
  head.use();
  glUniformMatrix4fv(head.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(f.vp));
  glUniform3fv(head.uniform("u_center"), 1, glm::value_ptr(h.position));
  glUniform1f(head.uniform("u_radius"), head_drawn_radius(f.scene, float(f.height)));
  glUniform3fv(head.uniform("u_eye"), 1, glm::value_ptr(f.scene.camera.eye));
  glUniform3fv(head.uniform("u_color"), 1, glm::value_ptr(h.color));
  glBindVertexArray(sphere_vao.get());
  glDrawElements(GL_TRIANGLES, sphere_index_count, GL_UNSIGNED_INT, nullptr);
  ++st.draw_calls;
}

void Renderer::Impl::draw_grid(const FrameView& f, FrameStats& st) {
  const Scene& scene = f.scene;
  if (!scene.grid.visible) return;
  glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
  float x0 = grid_x0, x1 = grid_x1, z0 = -10.0f, z1 = 10.0f;
  x1 = std::max(x1, scene.head.position.x + 8.0f);
  grid.use();
  glUniformMatrix4fv(grid.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(f.vp));
  glUniform4f(grid.uniform("u_extent"), x0, z0, x1, z1);
  glUniform1f(grid.uniform("u_height"), scene.grid.height);
  glUniform1f(grid.uniform("u_spacing"), scene.grid.spacing);
  glUniform3fv(grid.uniform("u_color"), 1, glm::value_ptr(scene.grid.color));
  glBindVertexArray(empty_vao.get());
  glDrawArrays(GL_TRIANGLE_STRIP, 0, 4);
  ++st.draw_calls;
}

void Renderer::Impl::draw_beams(const FrameView& f, float wide_x0, float wide_x1,
                                FrameStats& st) {
  if (beam_gpu.empty()) return;
  const SceneAnim& anim = f.scene.anim;
  beam.use();
  glUniform3fv(beam.uniform("u_shift"), 1, glm::value_ptr(anim.beam_shift));
  glUniform1f(beam.uniform("u_fade"), std::max(anim.beam_fade, 0.0f));
  glUniform3f(beam.uniform("u_arc"), anim.beam_arc.rise, anim.beam_arc.rise_per_span,
              anim.beam_arc.lean_per_span);
  glUniformMatrix4fv(beam.uniform("u_view_proj"), 1, GL_FALSE, glm::value_ptr(f.vp));
  glUniform3fv(beam.uniform("u_eye"), 1, glm::value_ptr(f.scene.camera.eye));
  glUniform1i(beam.uniform("u_segments"), kBeamSegments);
  glUniform1f(beam.uniform("u_px_scale"), f.proj[1][1] * 0.5f * float(f.height));
  glUniform1f(beam.uniform("u_min_px"), 1.3f);
  // A beam to a token out of view leaves the view on its way there: most of the pixels it
  // covers are its ribbon crossing the others near the head, hundreds of beams deep over
  // a long sequence. Those are drawn at the least width (u_min_px), a level of detail;
  // the ones to tokens in view (u_wide_x) keep their ribbon.
  glUniform1f(beam.uniform("u_width"), kBeamWidth);
  glUniform2f(beam.uniform("u_wide_x"), wide_x0, wide_x1);
  // Hundreds of those hairlines still cost (long thin triangles across the view's tiles)
  // and overlap where they leave it: past kOffViewBeams, only the strongest beam of each
  // stretch of the sequence out of view is drawn.
  size_t drawn = beam_gpu.size();
  glBindVertexArray(beam_vao.get());
  if (beams_sorted && wide_x0 <= wide_x1 && wide_x1 < std::numeric_limits<float>::max()) {
    const InstanceRange wide =
        x_range(beam_gpu, wide_x0, wide_x1, [](const BeamInstance& b) { return b.to.x; });
    const size_t end = wide.first + wide.count;
    if (wide.first + (beam_gpu.size() - end) > kOffViewBeams) {
      if (beam_lod_pack != packs || beam_lod_first != wide.first || beam_lod_end != end) {
        make_beam_lod(wide.first, end);
        glBindBuffer(GL_ARRAY_BUFFER, beam_lod_inst.get());
        glBufferData(GL_ARRAY_BUFFER, GLsizeiptr(beam_lod.size() * sizeof(BeamInstance)),
                     beam_lod.data(), GL_DYNAMIC_DRAW);
        beam_lod_pack = packs;
        beam_lod_first = wide.first;
        beam_lod_end = end;
      }
      drawn = beam_lod.size();
      glBindVertexArray(beam_lod_vao.get());
    }
  }
  glDrawArraysInstanced(GL_TRIANGLE_STRIP, 0, 2 * (kBeamSegments + 1), GLsizei(drawn));
  st.drawn_beams = drawn;
  ++st.draw_calls;
}

void Renderer::Impl::draw_halo(const FrameView& f, FrameStats& st) {
  const auto& h = f.scene.head;
  if (!(h.visible && h.glow > 0.0f)) return;
  halo.use();
  glUniformMatrix4fv(halo.uniform("u_view"), 1, GL_FALSE, glm::value_ptr(f.view));
  glUniformMatrix4fv(halo.uniform("u_proj"), 1, GL_FALSE, glm::value_ptr(f.proj));
  glUniform3fv(halo.uniform("u_center"), 1, glm::value_ptr(h.position));
  glUniform1f(halo.uniform("u_size"), head_drawn_radius(f.scene, float(f.height)) * 4.0f);
  glUniform3fv(halo.uniform("u_color"), 1, glm::value_ptr(h.color));
  glUniform1f(halo.uniform("u_glow"), std::clamp(h.glow, 0.0f, 1.0f));
  glBindVertexArray(empty_vao.get());
  glDrawArrays(GL_TRIANGLE_STRIP, 0, 4);
  ++st.draw_calls;
}

void Renderer::Impl::draw_glyphs(const FrameView& f, InstanceRange range,
                                 const GlyphAtlas& atlas, FrameStats& st) {
  if (range.count == 0) return;
  const Scene& scene = f.scene;
  glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
  glyph.use();
  glUniform1f(glyph.uniform("u_fall"), std::clamp(scene.anim.fall, 0.0f, 1.0f));
  glUniform1f(glyph.uniform("u_slide"), std::clamp(scene.anim.slide, 0.0f, 1.0f));
  glUniformMatrix4fv(glyph.uniform("u_view"), 1, GL_FALSE, glm::value_ptr(f.view));
  glUniformMatrix4fv(glyph.uniform("u_proj"), 1, GL_FALSE, glm::value_ptr(f.proj));
  glUniform1f(glyph.uniform("u_height"), scene.label_height);
  glUniform1f(glyph.uniform("u_viewport_h"), float(f.height));
  glUniform1f(glyph.uniform("u_fit_px"), scene.label_fit_px);
  glUniform1i(glyph.uniform("u_vertical"), scene.labels_vertical ? 1 : 0);
  glUniform2f(glyph.uniform("u_texel"), 1.0f / atlas.size(), 1.0f / atlas.size());
  glActiveTexture(GL_TEXTURE0);
  glBindTexture(GL_TEXTURE_2D, atlas_tex.get());
  glUniform1i(glyph.uniform("u_atlas"), 0);
  bind_glyph_instances(range.first);
  glDrawArraysInstanced(GL_TRIANGLE_STRIP, 0, 4, GLsizei(range.count));
  ++st.draw_calls;
}

void Renderer::draw(const Scene& scene, int fb_width, int fb_height, Viewport view_rect) {
  auto t0 = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  stats_ = FrameStats{};
  auto lap = t0;
  auto mark = [&](Pass p) {  // with profiling: the part just drawn, finished
    if (!profile_passes_) return;
    glFinish();
    const auto now = std::chrono::steady_clock::now();
    stats_.pass_ms[size_t(p)] += std::chrono::duration<double, std::milli>(now - lap).count();
    lap = now;
  };
  // Clip the rectangle to the framebuffer.
  int x0 = std::max(view_rect.x, 0), y0 = std::max(view_rect.y, 0);
  int x1 = std::min(view_rect.x + view_rect.width, fb_width);
  int y1 = std::min(view_rect.y + view_rect.height, fb_height);
  if (x1 <= x0 || y1 <= y0) return;
  const int width = x1 - x0, height = y1 - y0;
  const int gl_y = fb_height - y1;  // GL's origin is the bottom-left

  // ---- instances: reuse, or pack and send what changed ----
  if (scene.revision == 0 || scene.revision != m.revision) {
    m.pack(scene, atlas_);
    stats_.uploaded_bytes += upload_changes(m.token_inst, m.token_data, &m.token_gpu);
    stats_.uploaded_bytes += upload_changes(m.kv_inst, m.kv_data, &m.kv_gpu);
    stats_.uploaded_bytes += upload_changes(m.beam_inst, m.beam_data, &m.beam_gpu);
    stats_.uploaded_bytes += upload_changes(m.glyph_inst, m.glyph_data, &m.glyph_gpu);
    stats_.uploaded_bytes += upload_changes(m.marker_inst, m.marker_data, &m.marker_gpu);
    m.revision = scene.revision;
    stats_.prepare_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  } else {
    stats_.reused = true;
  }
  mark(Pass::Prepare);

  // ---- frame state ----
  const float aspect = float(width) / float(height);
  FrameView f{scene, view_matrix(scene.camera), projection_matrix(scene.camera, aspect), {},
              height};
  f.vp = f.proj * f.view;
  glViewport(x0, gl_y, width, height);
  glEnable(GL_SCISSOR_TEST);
  glScissor(x0, gl_y, width, height);
  glClearColor(scene.background.r, scene.background.g, scene.background.b, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT | GL_DEPTH_BUFFER_BIT);
  glEnable(GL_DEPTH_TEST);
  glDepthFunc(GL_LEQUAL);
  glDepthMask(GL_TRUE);
  glDisable(GL_BLEND);
  glDisable(GL_CULL_FACE);
  mark(Pass::Clear);

  // ---- opaque parts, then the blended layers ----
  const VisibleRanges in_view = m.visible_ranges(scene, f.vp);
  m.draw_blocks(f, m.token_vao, m.token_inst, in_view.tok, scene.token_size, stats_);
  mark(Pass::Tokens);
  m.draw_blocks(f, m.kv_vao, m.kv_inst, in_view.kv, scene.kv_block_size, stats_);
  mark(Pass::KvBlocks);
  m.draw_markers(f, stats_);
  mark(Pass::Markers);
  m.draw_head(f, stats_);
  mark(Pass::Head);

  glEnable(GL_BLEND);
  glDepthMask(GL_FALSE);
  m.draw_grid(f, stats_);
  mark(Pass::Grid);
  glBlendFunc(GL_ONE, GL_ONE);  // additive: beams and glow only ever add light
  m.draw_beams(f, in_view.wide_x0, in_view.wide_x1, stats_);
  mark(Pass::Beams);
  m.draw_halo(f, stats_);
  mark(Pass::Halo);
  m.draw_glyphs(f, in_view.glyph, atlas_, stats_);
  mark(Pass::Glyphs);

  glBindVertexArray(0);
  glDepthMask(GL_TRUE);
  glDisable(GL_BLEND);
  glDisable(GL_SCISSOR_TEST);
  glDisable(GL_DEPTH_TEST);
  glUseProgram(0);

  stats_.tokens = m.token_gpu.size();
  stats_.kv_blocks = m.kv_gpu.size();
  stats_.beams = m.beam_gpu.size();
  stats_.glyphs = m.glyph_gpu.size();
  stats_.drawn_tokens = in_view.tok.count;
  stats_.drawn_kv_blocks = in_view.kv.count;
  stats_.drawn_glyphs = in_view.glyph.count;
  stats_.cpu_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kvscope::render
