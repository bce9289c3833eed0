// scene_builder.cpp — token blocks, KV stacks, beams and the head from the timeline.
//
// Animation of one step (seconds since its trace arrived): beams flash in and fade to a
// steady level, the new token drops into its slot, NO_CACHE recompute flashes decay.
#include "app/scene_builder.h"

#include <algorithm>
#include <cmath>

#include "engine/printable.h"
#include "render/layout.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

std::string display_text(const std::string& raw) {
  // Token bytes come from the model file: control bytes as visible escapes first.
  const std::string text = printable_text(raw);
  std::string out;
  bool any_visible = false;
  for (char c : text) {
    if (c == '\n')
      out += "\xE2\x86\xB5";  // ↵
    else if (c == '\t')
      out += "\xE2\x86\x92";  // →
    else if (c == '\r')
      continue;
    else
      out += c;
    if (c != ' ') any_visible = true;
  }
  if (!any_visible && !text.empty()) {
    out.clear();
    for (char c : text)
      if (c == ' ') out += "\xC2\xB7";  // spaces shown as middle dots
  }
  return out;
}

int resolved_layer(const ViewOptions& opts, int n_layer) {
  if (n_layer <= 0) return 0;
  if (opts.layer == kMiddleLayer) return n_layer / 2;
  return std::clamp(opts.layer, 0, n_layer - 1);
}

std::string describe_view(const ViewOptions& opts, int n_layer) {
  std::string s = opts.all_layers ? "mean over all layers"
                                  : "layer " + std::to_string(resolved_layer(opts, n_layer));
  switch (opts.aggregation) {
    case HeadAggregation::Single: s += ", head " + std::to_string(opts.head); break;
    case HeadAggregation::Mean: s += ", mean over heads"; break;
    case HeadAggregation::Max: s += ", max over heads"; break;
  }
  if (opts.renormalize_sink) s += ", without the sink";
  return s;
}

std::vector<float> beam_weights(const StepTrace& t, const ViewOptions& opts) {
  const int n = t.n_attn, L = t.n_layer, H = t.n_head;
  std::vector<float> w(size_t(std::max(n, 0)), 0.0f);
  if (n <= 0 || L <= 0 || H <= 0 || t.attention.size() < size_t(L) * H * n) return w;
  int l0 = opts.all_layers ? 0 : resolved_layer(opts, L);
  int l1 = opts.all_layers ? L : l0 + 1;
  int h0 = opts.aggregation == HeadAggregation::Single ? std::clamp(opts.head, 0, H - 1) : 0;
  int h1 = opts.aggregation == HeadAggregation::Single ? h0 + 1 : H;
  for (int l = l0; l < l1; ++l) {
    std::vector<float> per(size_t(n), 0.0f);
    for (int h = h0; h < h1; ++h) {
      const float* a = &t.attention[(size_t(l) * H + h) * n];
      for (int j = 0; j < n; ++j) {
        if (opts.aggregation == HeadAggregation::Max)
          per[size_t(j)] = std::max(per[size_t(j)], a[j]);
        else
          per[size_t(j)] += a[j] / float(h1 - h0);
      }
    }
    for (int j = 0; j < n; ++j) w[size_t(j)] += per[size_t(j)] / float(l1 - l0);
  }
  if (opts.renormalize_sink || opts.aggregation == HeadAggregation::Max) {
    if (opts.renormalize_sink) w[0] = 0.0f;
    float sum = 0;
    for (float x : w) sum += x;
    if (sum > 0)
      for (float& x : w) x /= sum;
  }
  return w;
}

namespace {

float smooth01(float x) {
  x = std::clamp(x, 0.0f, 1.0f);
  return x * x * (3.0f - 2.0f * x);
}

}  // namespace

float beam_brightness(float w, float max_w) {
  if (!(w > 0.0f) || !(max_w > 0.0f)) return 0.0f;
  return std::clamp(1.0f + std::log10(w / max_w) / kBrightnessDecades, 0.0f, 1.0f);
}

std::vector<int> strongest_targets(const std::vector<float>& w, int k) {
  std::vector<int> order(w.size());
  for (size_t i = 0; i < w.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return w[size_t(a)] > w[size_t(b)]; });
  // Labels of neighbouring positions would overlap when the whole sequence is on screen:
  // keep the chosen ones at least 1/48 of the sequence apart.
  const int gap = std::max(1, int(w.size()) / 48);
  std::vector<int> out;
  for (int j : order) {
    if (int(out.size()) >= k || w[size_t(j)] <= 0.0f) break;
    bool clear = true;
    for (int o : out) clear &= std::abs(o - j) >= gap;
    if (clear) out.push_back(j);
  }
  return out;
}

namespace {
// Animation of one step, from the seconds since its trace arrived.
float drop_progress(double since) { return smooth01((float(since) - 0.05f) / 0.35f); }
float step_flash(double since) { return std::exp(-float(since) / 0.8f); }
float beam_fade(double since) { return 0.75f + 0.25f * std::exp(-float(since) / 0.5f); }
}  // namespace

namespace {

// What the newest step did to the cache, as the KV blocks show it.
struct KvStepState {
  bool nocache = false;                     // NO CACHE: nothing is kept, all is recomputed
  int written_first = 0, written_end = 0;  // positions whose K/V rows this step wrote
};

// One layer's cache entry at one position: the one place a block's look is decided, so
// a new per-block state (a position a windowed layer has evicted, say) is one more case.
// Blocks written this step flash (SceneAnim::flash); in NO CACHE they flash red.
render::KvBlockInstance kv_block(const Timeline& tl, const ViewOptions& opts,
                                 const KvStepState& step, int pos, int layer) {
  const bool written_now = pos >= step.written_first && pos < step.written_end;
  render::KvBlockInstance k;
  k.position = render::layout::kv_block_position(pos, layer);
  float v = tl.kv_norm(pos, layer, opts.color_by_v);
  if (std::isnan(v)) {  // not computed yet (the newest token, before the next step)
    k.color = {0.16f, 0.18f, 0.24f};
    k.brightness = 0.35f;
  } else {
    float lo = tl.kv_norm_min(layer, opts.color_by_v), hi = tl.kv_norm_max(layer, opts.color_by_v);
    float x = hi > lo ? (v - lo) / (hi - lo) : 0.5f;
    k.color = render::palette::kv_color(x);
    k.brightness = step.nocache ? 0.55f : 0.95f;  // NO CACHE keeps nothing: dimmer stacks
    if (written_now && !step.nocache) k.flash_brightness = 0.6f;
  }
  if (step.nocache && written_now) {
    k.recompute = 0.35f;
    k.flash_recompute = 0.65f;
  }
  return k;
}

}  // namespace

render::Scene build_scene(const Timeline& tl, const ViewOptions& opts, const AnimClock& clock) {
  namespace layout = render::layout;
  render::Scene s;
  s.revision = render::next_scene_revision();
  const StepTrace* last = tl.last();
  const int n_layer = std::max(tl.n_layer(), last ? last->n_layer : 0);
  const int n_tok = int(tl.tokens().size());

  // Tokens. The newest generated token falls into its slot (SceneAnim::fall).
  for (int i = 0; i < n_tok; ++i) {
    const TokenInfo& ti = tl.tokens()[size_t(i)];
    render::TokenInstance t;
    t.position = layout::token_position(i);
    bool newest = last && i == last->pos && !ti.prompt;
    if (newest) t.drop = layout::kHeadHeight - 0.2f;
    t.color = ti.prompt ? render::palette::kPromptToken : render::palette::kGeneratedToken;
    t.brightness = ti.prompt ? 0.7f : 1.0f;
    if (opts.labels) t.label = display_text(ti.text);
    t.highlighted = i == opts.hovered_pos;
    s.tokens.push_back(std::move(t));
  }

  // KV stacks: one block per layer under every position.
  KvStepState step;
  step.nocache = last && last->mode == CacheMode::NoCache;
  step.written_first = last ? last->kv_first_pos : 0;
  step.written_end = last ? last->kv_first_pos + last->kv_written : 0;
  s.kv_blocks.reserve(size_t(n_tok) * size_t(std::max(n_layer, 0)));
  for (int i = 0; i < n_tok; ++i)
    for (int l = 0; l < n_layer; ++l) s.kv_blocks.push_back(kv_block(tl, opts, step, i, l));

  // Beams from the head's slot (SceneAnim::beam_shift slides them with the head).
  glm::vec3 origin = layout::head_position(n_tok);
  if (last && last->pos == n_tok - 1) origin = layout::head_position(last->pos);
  if (last && last->n_attn > 0) {
    std::vector<float> w = beam_weights(*last, opts);
    if (opts.labels) {
      for (int j : strongest_targets(w, kReadableTargets))
        if (j < n_tok) s.tokens[size_t(j)].label_min_px = kReadableLabelPx;
    }
    float mx = *std::max_element(w.begin(), w.end());
    for (int j = 0; j < int(w.size()); ++j) {
      render::Beam b;
      b.from = origin;
      b.to = layout::beam_target(j, s.token_size.y);
      b.weight = beam_brightness(w[size_t(j)], mx);
      b.color = render::palette::kBeam;
      s.beams.push_back(b);
    }
  }
  // The newest token stays readable from any distance too.
  if (opts.labels && n_tok > 0) s.tokens.back().label_min_px = kReadableLabelPx;
  s.grid.height = layout::floor_height(n_layer);
  animate_scene(&s, tl, clock);
  return s;
}

void animate_scene(render::Scene* scene, const Timeline& tl, const AnimClock& clock) {
  namespace layout = render::layout;
  render::Scene& s = *scene;
  const StepTrace* last = tl.last();
  const int n_tok = int(tl.tokens().size());
  const float drop = drop_progress(clock.since_step);
  s.anim.fall = 1.0f - drop;
  s.anim.flash = step_flash(clock.since_step);
  s.anim.beam_fade = beam_fade(clock.since_step);
  // The head sits above the slot being generated; after a step it slides one slot right
  // as the new token lands, and the beams' origin goes with it.
  s.head.position = layout::head_position(n_tok);
  s.anim.beam_shift = glm::vec3(0.0f);
  if (last && last->pos == n_tok - 1) {
    glm::vec3 shift(drop * layout::kTokenSpacing, 0.0f, 0.0f);
    s.head.position = layout::head_position(last->pos) + shift;
    s.anim.beam_shift = shift;
  }
  float pulse = 0.5f + 0.5f * std::sin(float(clock.time) * 6.0f);
  s.head.glow = clock.busy ? 0.75f + 0.25f * pulse : 0.8f;
}

}  // namespace kvscope::app
