// scene_builder.h — timeline + animation clock + UI choices -> render::Scene.
//
// The only place engine data becomes geometry. Pure functions of their inputs, so the
// headless capture, the window and the tests build identical scenes.
#pragma once

#include <string>
#include <vector>

#include "app/core/timeline.h"
#include "engine/printable.h"
#include "render/scene.h"

namespace kvscope::app {

enum class HeadAggregation { Single, Mean, Max };

// The default view opens on a middle layer, mean over heads, sinks shown as they are:
// the first thing people see is a meaningful attention fan.
inline constexpr int kMiddleLayer = -1;

struct ViewOptions {
  int layer = kMiddleLayer;  // selected layer (when !all_layers); kMiddleLayer = n_layer / 2
  bool all_layers = false;   // average the weights over every layer
  int head = 0;              // selected head (when aggregation == Single)
  HeadAggregation aggregation = HeadAggregation::Mean;
  bool renormalize_sink = false;  // drop position 0 and renormalize the rest to sum 1
  bool color_by_v = false;        // color KV blocks by the V norm instead of K
  // Color KV blocks by the measured quantization error of their K (or V, with color_by_v)
  // rows instead of the norm (kv_error_color); grey where it was not measured.
  bool color_by_error = false;
  bool labels = true;
  int hovered_pos = -1;
  // The run's cache, from the model facts (the traces do not carry them): KV heads per layer
  // (each KV block splits into that many slices; 0 = one) and the K/V element types.
  int n_head_kv = 0;
  KvTypes kv_types;
  bool operator==(const ViewOptions&) const = default;
};

// Animation clock: seconds since the newest trace arrived, and whether a step runs now.
struct AnimClock {
  double since_step = 1e9;
  bool busy = false;
  double time = 0;  // monotonically increasing seconds (pulses)
};

// Attention weights of trace `t` over positions [0, t.n_attn), aggregated as `opts`
// says (sums to 1 unless the trace has no attention). Position 0 is zero when
// renormalize_sink is on.
// The layer `opts` selects for a model with `n_layer` layers (kMiddleLayer resolved,
// out-of-range values clamped).
int resolved_layer(const ViewOptions& opts, int n_layer);
// "layer 15, mean over heads" and the like, for labels and tooltips.
std::string describe_view(const ViewOptions& opts, int n_layer);

std::vector<float> beam_weights(const StepTrace& t, const ViewOptions& opts);

// Display brightness of an attention weight next to the strongest one `max_w`: 1 for the
// strongest, falling linearly with log10 of the ratio to 0 at kBrightnessDecades below it.
// Monotone (brightness order is the engine's order); a log scale keeps the few targets
// that matter visible next to a sink holding 70% of the weight, even over 2,000 tokens
// where most weights are 1/2,000 of it (the beams and the overview's bars both use it).
inline constexpr float kBrightnessDecades = 3.0f;
float beam_brightness(float w, float max_w);

// Level of detail for labels: the positions receiving the most attention (and the newest
// token) keep labels at least kReadableLabelPx tall however far the camera is; the others
// shrink with distance and fade out once unreadable (render::TokenInstance::label_min_px).
inline constexpr int kReadableTargets = 12;
inline constexpr float kReadableLabelPx = 13.0f;
// Up to `k` positions in decreasing weight, skipping any closer than 1/48 of the sequence
// to one already chosen (so their labels do not overlap when it is all on screen).
std::vector<int> strongest_targets(const std::vector<float>& w, int k);

// The scene's content (instances) from the timeline and view, with a fresh revision, and
// its animation for `clock` (animate_scene). The content does not depend on the clock.
// `label_priority` (optional) receives the positions whose labels matter most, most
// important first (the newest token, then the strongest targets): place_flat_labels' order.
render::Scene build_scene(const Timeline& tl, const ViewOptions& opts, const AnimClock& clock,
                          std::vector<int>* label_priority = nullptr);

// Readable labels when the camera looks down (TOP), where vertical labels are hard to read:
// the labels of `priority`'s positions, in that order, are made flat (horizontal, under the
// sequence) in the first of `lanes` lanes where they overlap no label placed before; the
// others stay as they are. `px_per_token`: the token spacing on screen in pixels. Returns
// the number made flat. Widths are estimated from the text (kFlatCharEm per character).
inline constexpr int kFlatLanes = 3;
inline constexpr float kFlatCharEm = 0.62f;  // a character's advance, in text lines (generous)
int place_flat_labels(render::Scene* s, const std::vector<int>& priority, float px_per_token,
                      int lanes = kFlatLanes);
// A label's line height on screen for that token spacing (the glyph shader's rule for a
// label with label_min_px = kReadableLabelPx), and its estimated width.
float flat_label_px(const render::Scene& s, float px_per_token);
float flat_label_width_px(const std::string& label, float line_px);
// The write head is drawn at least this many pixels in radius in every preset (its halo four
// times that), so it stays findable when TOP frames hundreds of tokens.
inline constexpr float kHeadMinPx = 6.0f;
// Sets only the per-frame parts (scene.anim, head position and glow) for `clock`; the
// instances and revision stay, so the renderer re-uploads nothing.
void animate_scene(render::Scene* scene, const Timeline& tl, const AnimClock& clock);

// Display text for a token label (engine/printable.h's printable_label: control bytes as
// visible escapes, newlines/tabs as visible symbols, a spaces-only text as middle dots): the
// name the scene and the panels use.
inline std::string display_text(const std::string& text) {
  return printable_label(text);
}

}  // namespace kvscope::app
