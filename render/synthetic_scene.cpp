// synthetic_scene.cpp — deterministic test/benchmark scenes.
#include "render/synthetic_scene.h"

#include <algorithm>
#include <cmath>

#include "render/camera.h"
#include "render/layout.h"

namespace kvscope::render {

glm::vec3 palette::kv_color(float t) {
  t = std::clamp(t, 0.0f, 1.0f);
  // deep blue -> teal -> pale mint
  glm::vec3 a{0.10f, 0.22f, 0.55f}, b{0.12f, 0.62f, 0.70f}, c{0.72f, 0.95f, 0.85f};
  return t < 0.5f ? a + (b - a) * (t * 2.0f) : b + (c - b) * ((t - 0.5f) * 2.0f);
}

Scene make_synthetic_scene(const SyntheticSpec& spec) {
  Scene s;
  int n = std::max(spec.n_tokens, 0);
  static const char* kWords[] = {"Once",    " upon",    " a",   " time",  ",",      " in",
                                 " a",      " kingdom", " far", " away",  " lived", " a",
                                 " dragon", ".",        " It",  " loved", " gold",  "\xE2\x86\xB5"};
  for (int i = 0; i < n; ++i) {
    TokenInstance t;
    t.position = layout::token_position(i);
    bool prompt = i < spec.n_prompt;
    t.color = prompt ? palette::kPromptToken : palette::kGeneratedToken;
    t.brightness = prompt ? 0.7f : 1.0f;
    if (spec.labels) t.label = kWords[i % (sizeof(kWords) / sizeof(kWords[0]))];
    s.tokens.push_back(std::move(t));
    for (int l = 0; l < spec.n_layers; ++l) {
      KvBlockInstance k;
      k.position = layout::kv_block_position(i, l);
      float v = 0.5f + 0.5f * std::sin(0.7f * i + 1.3f * l);
      k.color = palette::kv_color(v);
      k.brightness = 1.0f;
      k.recompute = spec.recompute ? 1.0f : 0.0f;
      s.kv_blocks.push_back(k);
    }
  }
  std::vector<float> w = spec.weights;
  if (w.empty()) {
    w.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
      float local = std::exp(-0.35f * float(n - 1 - i));
      float spike = (i % 7 == 3) ? 0.45f : 0.0f;
      w[size_t(i)] = (i == 0 ? 0.9f : 0.0f) + local + spike;
    }
    float mx = *std::max_element(w.begin(), w.end());
    if (mx > 0)
      for (float& x : w) x /= mx;
  }
  s.head.position = layout::head_position(n);
  for (int i = 0; i < n && i < int(w.size()); ++i) {
    Beam b;
    b.from = s.head.position;
    b.to = layout::beam_target(i, s.token_size.y);
    b.weight = w[size_t(i)];
    b.color = palette::kBeam;
    s.beams.push_back(b);
  }
  s.grid.height = layout::floor_height(spec.n_layers);
  return s;
}

Bounds scene_bounds(const Scene& s) {
  Bounds b{{-1.0f, s.grid.height, -1.0f}, {1.0f, layout::kHeadHeight + 1.0f, 1.0f}};
  auto grow = [&](glm::vec3 p) {
    b.min = glm::min(b.min, p);
    b.max = glm::max(b.max, p);
  };
  for (const TokenInstance& t : s.tokens) grow(t.position + glm::vec3(0.0f, 3.0f, 0.0f));
  if (s.head.visible) grow(s.head.position + glm::vec3(s.head.radius));
  if (!s.tokens.empty()) grow(s.tokens.front().position - glm::vec3(0.5f));
  // Never frame less than a dozen slots, so an empty scene is not a close-up of the head.
  if (b.max.x - b.min.x < 12.0f) b.max.x = b.min.x + 12.0f;
  // Beam arcs peak halfway to their control point (see shaders/beam.vert).
  for (const Beam& bm : s.beams) grow(beam_apex(bm.from + s.anim.beam_shift, bm.to, s.anim.beam_arc));
  return b;
}

}  // namespace kvscope::render
