// scene_shift.cpp — the context shift's survivors, dropped positions and marker (scene_shift.h).
#include "app/scene/scene_shift.h"

#include <algorithm>
#include <cmath>

#include "app/scene/scene_kv.h"
#include "render/layout.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

namespace {

constexpr glm::vec3 kKeptMarker{0.35f, 0.95f, 0.45f};  // the sink marker's green

float ease(float x) {
  x = std::clamp(x, 0.0f, 1.0f);
  return x * x * (3.0f - 2.0f * x);
}

bool held_in(const std::vector<KvRange>& r, int pos) {
  return std::any_of(r.begin(), r.end(),
                     [&](const KvRange& x) { return pos >= x.begin && pos < x.end; });
}

}  // namespace

float ShiftLook::slide_of(int pos) const {
  if (!active() || pos < first) return 0.0f;
  return float(n) * render::layout::kTokenSpacing;
}

ShiftLook viewed_shift(const Timeline& tl) {
  ShiftLook s;
  const StepTrace* t = tl.viewed();
  if (!t || t->shift_n <= 0) return s;
  s.first = t->shift_first;
  s.n = t->shift_n;
  return s;
}

float shift_slide_left(double since) {
  return 1.0f - ease(float((since - kShiftSlideDelay) / kShiftSlideSeconds));
}

float shift_leave_progress(double since) {
  return ease(float(since / (kShiftSlideDelay + kShiftSlideSeconds)));
}

std::vector<KvRange> ranges_after_shift(const std::vector<KvRange>& before, int first, int n) {
  std::vector<KvRange> out;
  for (const KvRange& r : before) {
    if (r.begin < first) out.push_back({r.begin, std::min(r.end, first)});
    const int b = std::max(r.begin, first + n);
    if (r.end > b) out.push_back({b - n, r.end - n});
  }
  // Pieces that now touch (a range across the dropped part) become one.
  std::vector<KvRange> merged;
  for (const KvRange& r : out) {
    if (!merged.empty() && merged.back().end == r.begin)
      merged.back().end = r.end;
    else
      merged.push_back(r);
  }
  return merged;
}

void add_shift_ghosts(render::Scene* s, const Timeline& tl, const ViewOptions& opts,
                      const ShiftLook& shift, int n_layer) {
  namespace layout = render::layout;
  if (!shift.active()) return;
  const int step_before = tl.viewed_step() - 1;
  const StepTrace* before = previous_trace(tl);
  const bool known =
      before && before->mode == CacheMode::Cache && int(before->kv_layers.size()) == n_layer;
  const int n_heads = std::max(opts.n_head_kv, 1);
  for (int p = shift.first; p < shift.first + shift.n; ++p) {
    const int idx = tl.token_index_at(p, step_before);
    if (idx < 0) continue;
    const TokenInfo& ti = tl.tokens()[size_t(idx)];
    render::TokenInstance t;
    t.position = layout::token_position(p);
    t.color = ti.prompt ? render::palette::kPromptToken : render::palette::kGeneratedToken;
    t.brightness = 0.3f;  // dimmed: it is leaving (and has no label)
    t.leave = 1.0f;
    s->tokens.push_back(t);
    for (int h = 0; h < n_heads; ++h)
      for (int l = 0; l < n_layer; ++l) {
        if (known && !held_in(before->kv_layers[size_t(l)].held, p)) continue;
        const float v = tl.kv_norm_of_index(idx, l, opts.color_by_v);
        if (std::isnan(v)) continue;
        const float lo = tl.kv_norm_min(l, opts.color_by_v),
                    hi = tl.kv_norm_max(l, opts.color_by_v);
        render::KvBlockInstance k;
        k.position = layout::kv_head_position(p, l, h, n_heads);
        k.color = render::palette::kv_color(hi > lo ? (v - lo) / (hi - lo) : 0.5f);
        if (opts.color_by_error) {
          const float e = tl.kv_error_of_index(idx, l, opts.color_by_v);
          k.color = std::isnan(e) ? kKvErrorUnmeasured : kv_error_color(e);
        }
        k.brightness = 0.95f;
        k.hatch_k = kv_hatch(opts.kv_types.k);
        k.hatch_v = kv_hatch(opts.kv_types.v);
        k.leave = 1.0f;
        s->kv_blocks.push_back(k);
      }
  }
  // Where the kept positions end: a green strip on the floor and a plate beside the stacks.
  const float x = float(shift.first) * layout::kTokenSpacing - 0.5f * layout::kTokenSpacing;
  render::MarkerInstance m;
  m.center = {x, layout::floor_height(n_layer) + 0.02f, 0.0f};
  m.size = {0.1f, 0.03f, 3.2f};
  m.color = kKeptMarker;
  s->markers.push_back(m);
  m.center = {x, 0.5f * (layout::kKvTop + layout::kv_block_position(0, n_layer - 1).y), 0.0f};
  m.size = {0.07f, float(n_layer) * layout::kKvPitch, layout::kKvWidth + 0.3f};
  s->markers.push_back(m);
}

}  // namespace kvscope::app
