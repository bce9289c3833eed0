// scene_builder.cpp — token blocks, KV stacks, beams and the head from the timeline.
//
// Animation of one step (seconds since its trace arrived): beams flash in and fade to a
// steady level, the new token drops into its slot, NO_CACHE recompute flashes decay.
#include "app/scene/scene_builder.h"

#include <algorithm>
#include <cmath>

#include "app/scene/easing.h"
#include "app/scene/scene_kv.h"
#include "app/scene/scene_shift.h"
#include "render/glyph_atlas.h"
#include "render/layout.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

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
float leave_progress(double since) {
  return smooth01((float(since) - 0.1f) / 0.8f);
}
}  // namespace

render::Scene build_scene(const Timeline& tl, const ViewOptions& opts, const AnimClock& clock,
                          std::vector<int>* label_priority) {
  namespace layout = render::layout;
  render::Scene s;
  s.revision = render::next_scene_revision();
  // The viewed step (the newest one unless the person scrubbed back): the sequence as it
  // stood after that step.
  const StepTrace* last = tl.viewed();
  const int n_layer = std::max(tl.n_layer(), last ? last->n_layer : 0);
  const int n_tok = tl.viewed_seq_len();

  // Tokens. The newest generated token falls into its slot (SceneAnim::fall); after a
  // context shift the survivors slide left into their new positions (scene_shift.h).
  const ShiftLook shift = viewed_shift(tl);
  static const TokenInfo kNone;
  s.tokens.reserve(size_t(std::max(n_tok, 0)));
  for (int i = 0; i < n_tok; ++i) {
    const TokenInfo* at = tl.token_at(i);
    const TokenInfo& ti = at ? *at : kNone;
    render::TokenInstance t;
    t.position = layout::token_position(i);
    t.slide = shift.slide_of(i);
    bool newest = last && i == last->pos && !ti.prompt;
    if (newest) t.drop = layout::kHeadHeight - 0.2f;
    t.color = ti.prompt ? render::palette::kPromptToken : render::palette::kGeneratedToken;
    t.brightness = ti.prompt ? 0.7f : 1.0f;
    if (opts.labels) t.label = display_text(ti.text);
    t.highlighted = i == opts.hovered_pos;
    s.tokens.push_back(std::move(t));
  }

  // KV stacks: one block per layer (a slice per KV head) under every position the layer's
  // cache holds, the window boundaries (scene_kv.h).
  add_kv_stacks(&s, tl, opts, n_tok, n_layer);
  // A context shift's dropped positions leave where they stood (after every other instance).
  add_shift_ghosts(&s, tl, opts, shift, n_layer);

  // Beams from the head's slot (SceneAnim::beam_shift slides them with the head).
  glm::vec3 origin = layout::head_position(n_tok);
  if (last && last->pos == n_tok - 1) origin = layout::head_position(last->pos);
  if (last && last->n_attn > 0) {
    std::vector<float> w = beam_weights(*last, opts);
    if (opts.labels) {
      // The newest token first: what was just written is what people read.
      if (label_priority && n_tok > 0) label_priority->push_back(n_tok - 1);
      for (int j : strongest_targets(w, kReadableTargets))
        if (j < n_tok) {
          s.tokens[size_t(j)].label_min_px = kReadableLabelPx;
          if (label_priority) label_priority->push_back(j);
        }
    }
    float mx = *std::max_element(w.begin(), w.end());
    s.beams.reserve(w.size());
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
  const StepTrace* last = tl.viewed();
  const int n_tok = tl.viewed_seq_len();
  const float drop = drop_progress(clock.since_step);
  s.anim.fall = 1.0f - drop;
  s.anim.flash = step_flash(clock.since_step);
  s.anim.beam_fade = beam_fade(clock.since_step);
  s.anim.leave = leave_progress(clock.since_step);
  const ShiftLook shift = viewed_shift(tl);
  s.anim.slide = shift.active() ? shift_slide_left(clock.since_step) : 0.0f;
  if (shift.active()) s.anim.leave = shift_leave_progress(clock.since_step);
  s.anim.beam_fade *= 1.0f - s.anim.slide;  // the beams wait for a shift's slide to end
  // The head sits above the slot being generated; after a step it slides one slot right
  // as the new token lands, and the beams' origin goes with it.
  s.head.position = layout::head_position(n_tok);
  s.anim.beam_shift = glm::vec3(0.0f);
  if (last && last->pos == n_tok - 1) {
    glm::vec3 move(drop * layout::kTokenSpacing + shift.slide_of(last->pos) * s.anim.slide, 0.0f,
                   0.0f);
    s.head.position = layout::head_position(last->pos) + move;
    s.anim.beam_shift = move;
  }
  float pulse = 0.5f + 0.5f * std::sin(float(clock.time) * 6.0f);
  s.head.glow = clock.busy ? 0.75f + 0.25f * pulse : 0.8f;
  s.head.min_px = kHeadMinPx;
}

}  // namespace kvscope::app

namespace kvscope::app {

float flat_label_px(const render::Scene& s, float px_per_token) {
  // glyph.vert: the line is label_height world units tall, grown to at least
  // max(min_px, min(fit_px, 0.8 px per unit)); the token spacing is one world unit.
  const float unit_px = px_per_token / render::layout::kTokenSpacing;
  const float px = s.label_height * unit_px;
  return std::max(px, std::max(kReadableLabelPx, std::min(s.label_fit_px, 0.8f * unit_px)));
}

float flat_label_width_px(const std::string& label, float line_px) {
  size_t chars = 0;
  for (size_t i = 0; i < label.size();) {
    (void)render::next_codepoint(label, &i);
    ++chars;
  }
  return (float(chars) * kFlatCharEm + 0.4f) * line_px;
}

int place_flat_labels(render::Scene* s, const std::vector<int>& priority, float px_per_token,
                      int lanes) {
  for (render::TokenInstance& t : s->tokens) t.label_flat = false;
  if (!(px_per_token > 0.0f) || lanes <= 0) return 0;
  const float line_px = flat_label_px(*s, px_per_token);
  const float gap = 0.5f * line_px;
  using Extents = std::vector<std::pair<float, float>>;  // x ranges taken in one lane
  std::vector<Extents> taken(static_cast<size_t>(lanes));
  int placed = 0;
  for (int pos : priority) {
    if (pos < 0 || size_t(pos) >= s->tokens.size()) continue;
    render::TokenInstance& t = s->tokens[size_t(pos)];
    if (t.label.empty() || t.label_flat) continue;
    const float x = t.position.x / render::layout::kTokenSpacing * px_per_token;
    const float half = 0.5f * flat_label_width_px(t.label, line_px);
    for (int lane = 0; lane < lanes; ++lane) {
      auto& used = taken[size_t(lane)];
      const bool clear = std::none_of(used.begin(), used.end(), [&](const auto& e) {
        return x - half < e.second + gap && x + half > e.first - gap;
      });
      if (!clear) continue;
      used.push_back({x - half, x + half});
      t.label_flat = true;
      t.label_lane = lane;
      ++placed;
      break;
    }
  }
  return placed;
}

}  // namespace kvscope::app
