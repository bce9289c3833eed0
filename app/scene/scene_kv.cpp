// scene_kv.cpp — KV stacks, evictions, window boundaries, KV heads (scene_kv.h).
#include "app/scene/scene_kv.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "app/scene/scene_shift.h"
#include "render/layout.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

namespace {

bool in_ranges(const std::vector<KvRange>& r, int pos) {
  for (const KvRange& x : r)
    if (pos >= x.begin && pos < x.end) return true;
  return false;
}

// Window boundary and sink end of a layer's held ranges (see KvHoldings).
int window_start_of(const std::vector<KvRange>& held) {
  if (held.empty()) return -1;
  if (held.size() >= 2 || held[0].begin > 0) return held.back().begin;
  return -1;
}

constexpr glm::vec3 kWindowMarker{1.0f, 0.68f, 0.18f};
constexpr glm::vec3 kSinkMarker{0.35f, 0.95f, 0.45f};

}  // namespace

float kv_hatch(KvDtype t) {
  switch (t) {
    case KvDtype::Q8_0:
      return 14.0f;
    case KvDtype::Q4_0:
      return 6.0f;
    default:
      return 0.0f;
  }
}

float kv_error_scale(float e) {
  if (!(e > 0.0f)) return 0.0f;
  const float lo = std::log10(kKvErrorLow), hi = std::log10(kKvErrorHigh);
  return std::clamp((std::log10(e) - lo) / (hi - lo), 0.0f, 1.0f);
}

glm::vec3 kv_error_color(float e) {
  const glm::vec3 stops[] = {
      {0.12f, 0.14f, 0.42f}, {0.48f, 0.24f, 0.82f}, {0.92f, 0.32f, 0.90f}, {1.0f, 0.86f, 1.0f}};
  const float x = kv_error_scale(e) * 3.0f;
  const int i = std::min(int(x), 2);
  const float f = x - float(i);
  return stops[i] * (1.0f - f) + stops[i + 1] * f;
}

std::string kv_error_text(const Timeline& tl, int pos, int layer) {
  const float k = tl.kv_error(pos, layer, false), v = tl.kv_error(pos, layer, true);
  if (std::isnan(k) && std::isnan(v)) return "";
  auto percent = [](float e) {
    char b[24];
    std::snprintf(b, sizeof b, std::isnan(e) ? "n/a" : "%.2g%%", 100.0 * double(e));
    return std::string(b);
  };
  return "quantization error K " + percent(k) + "  V " + percent(v) + "  (layer " +
         std::to_string(layer) + ")";
}

int kv_head_of(int head, int n_head, int n_head_kv) {
  if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || head < 0 || head >= n_head)
    return -1;
  return head / (n_head / n_head_kv);
}

KvHoldings::KvHoldings(const StepTrace* now, const StepTrace* before) {
  if (!now || now->mode != CacheMode::Cache || now->kv_layers.empty()) return;
  known_ = true;
  written_first_ = now->kv_first_pos;
  written_end_ = now->kv_first_pos + now->kv_written;
  const bool had = before && before->mode == CacheMode::Cache &&
                   before->kv_layers.size() == now->kv_layers.size();
  layers_.resize(now->kv_layers.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].now = now->kv_layers[l].held;
    // After a context shift, the step before held positions numbered the old way.
    if (had)
      layers_[l].before = now->shift_n > 0 ? ranges_after_shift(before->kv_layers[l].held,
                                                                now->shift_first, now->shift_n)
                                           : before->kv_layers[l].held;
  }
}

KvSlot KvHoldings::slot(int layer, int pos) const {
  if (!known_ || layer < 0 || size_t(layer) >= layers_.size()) return KvSlot::Held;
  const Layer& L = layers_[size_t(layer)];
  if (pos >= written_end_ || in_ranges(L.now, pos)) return KvSlot::Held;
  const bool written_now = pos >= written_first_;
  return written_now || in_ranges(L.before, pos) ? KvSlot::Leaving : KvSlot::Gone;
}

int KvHoldings::window_start(int layer) const {
  if (!known_ || layer < 0 || size_t(layer) >= layers_.size()) return -1;
  return window_start_of(layers_[size_t(layer)].now);
}

int KvHoldings::sink_end(int layer) const {
  if (window_start(layer) < 0) return 0;
  const auto& held = layers_[size_t(layer)].now;
  return held.size() >= 2 && held[0].begin == 0 ? held[0].end : 0;
}

const StepTrace* previous_trace(const Timeline& tl) {
  const auto& steps = tl.steps();
  const size_t k = size_t(tl.viewed_step());  // the step looked at (history slider)
  return k >= 2 && k - 2 < steps.size() ? steps[k - 2].get() : nullptr;
}

namespace {

// What the newest step did to the cache, as the KV blocks show it.
struct KvStepLook {
  bool nocache = false;                    // NO CACHE: nothing is kept, all is recomputed
  int written_first = 0, written_end = 0;  // positions whose K/V rows this step wrote
  int lit_head = -1;                       // the KV head the selected query head reads
  float hatch_k = 0, hatch_v = 0;
};

// One layer's cache entry at one position (one KV head's slice of it): the one place a
// block's look is decided. Blocks written this step flash (SceneAnim::flash); in NO CACHE
// they flash red.
render::KvBlockInstance kv_block(const Timeline& tl, const ViewOptions& opts,
                                 const KvStepLook& step, int pos, int layer, int head,
                                 int n_heads) {
  const bool written_now = pos >= step.written_first && pos < step.written_end;
  render::KvBlockInstance k;
  k.position = render::layout::kv_head_position(pos, layer, head, n_heads);
  float v = tl.kv_norm(pos, layer, opts.color_by_v);
  if (std::isnan(v)) {  // not computed yet (the newest token, before the next step)
    k.color = {0.16f, 0.18f, 0.24f};
    k.brightness = 0.35f;
  } else {
    float lo = tl.kv_norm_min(layer, opts.color_by_v), hi = tl.kv_norm_max(layer, opts.color_by_v);
    float x = hi > lo ? (v - lo) / (hi - lo) : 0.5f;
    k.color = render::palette::kv_color(x);
    if (opts.color_by_error) {
      const float e = tl.kv_error(pos, layer, opts.color_by_v);
      k.color = std::isnan(e) ? kKvErrorUnmeasured : kv_error_color(e);
    }
    k.brightness = step.nocache ? 0.55f : 0.95f;  // NO CACHE keeps nothing: dimmer stacks
    if (written_now && !step.nocache) k.flash_brightness = 0.6f;
    k.hatch_k = step.hatch_k;
    k.hatch_v = step.hatch_v;
  }
  if (step.nocache && written_now) {
    k.recompute = 0.35f;
    k.flash_recompute = 0.65f;
  }
  if (step.lit_head >= 0) {
    if (head == step.lit_head) {
      k.highlight = 1.0f;
      k.brightness = std::max(k.brightness, 0.95f);
    } else {
      k.brightness *= 0.3f;
      k.flash_brightness *= 0.3f;
    }
  }
  return k;
}

}  // namespace

void add_kv_stacks(render::Scene* s, const Timeline& tl, const ViewOptions& opts, int n_tok,
                   int n_layer) {
  namespace layout = render::layout;
  const StepTrace* last = tl.viewed();  // the step looked at (the newest unless scrubbed)
  const int n_heads = std::max(opts.n_head_kv, 1);
  s->kv_block_size.x = layout::kv_head_width(n_heads);

  KvStepLook step;
  step.nocache = last && last->mode == CacheMode::NoCache;
  step.written_first = last ? last->kv_first_pos : 0;
  step.written_end = last ? last->kv_first_pos + last->kv_written : 0;
  if (opts.aggregation == HeadAggregation::Single && last)
    step.lit_head =
        kv_head_of(std::clamp(opts.head, 0, std::max(last->n_head - 1, 0)), last->n_head, n_heads);
  step.hatch_k = kv_hatch(opts.kv_types.k);
  step.hatch_v = kv_hatch(opts.kv_types.v);

  const KvHoldings hold(last, previous_trace(tl));
  const ShiftLook shift = viewed_shift(tl);  // survivors of a context shift slide left
  std::vector<KvSlot> slots(size_t(std::max(n_layer, 0)));
  s->kv_blocks.reserve(size_t(n_tok) * size_t(std::max(n_layer, 0)) * size_t(n_heads));
  for (int i = 0; i < n_tok; ++i) {
    for (int l = 0; l < n_layer; ++l) slots[size_t(l)] = hold.slot(l, i);
    for (int h = 0; h < n_heads; ++h)
      for (int l = 0; l < n_layer; ++l) {
        const KvSlot slot = slots[size_t(l)];
        if (slot == KvSlot::Gone) continue;
        render::KvBlockInstance k = kv_block(tl, opts, step, i, l, h, n_heads);
        if (slot == KvSlot::Leaving) {
          k.leave = 1.0f;
          k.flash_brightness = 0.0f;
        }
        k.slide = shift.slide_of(i);
        s->kv_blocks.push_back(k);
      }
  }

  // Window boundaries: a plate at each evicting layer's row, a strip on the floor.
  std::set<int> floor_marks;
  for (int l = 0; l < n_layer; ++l) {
    const int start = hold.window_start(l);
    if (start < 0) continue;
    const glm::vec3 row = layout::kv_block_position(0, l);
    render::MarkerInstance m;
    m.center = {float(start) * layout::kTokenSpacing - 0.5f * layout::kTokenSpacing, row.y, 0.0f};
    m.size = {0.07f, layout::kKvPitch * 0.92f, layout::kKvWidth + 0.3f};
    m.color = kWindowMarker;
    s->markers.push_back(m);
    floor_marks.insert(start);
    if (const int sink = hold.sink_end(l); sink > 0) {
      m.center.x = float(sink) * layout::kTokenSpacing - 0.5f * layout::kTokenSpacing;
      m.color = kSinkMarker;
      s->markers.push_back(m);
    }
  }
  for (int start : floor_marks) {
    render::MarkerInstance m;
    m.center = {float(start) * layout::kTokenSpacing - 0.5f * layout::kTokenSpacing,
                layout::floor_height(n_layer) + 0.02f, 0.0f};
    m.size = {0.1f, 0.03f, 3.2f};
    m.color = kWindowMarker;
    s->markers.push_back(m);
  }
}

}  // namespace kvscope::app
