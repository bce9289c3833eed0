// scene_builder.h — timeline + animation clock + UI choices -> render::Scene.
//
// The only place engine data becomes geometry. Pure functions of their inputs, so the
// headless capture, the window and the tests build identical scenes.
#pragma once

#include <vector>

#include "app/timeline.h"
#include "render/scene.h"

namespace kvscope::app {

enum class HeadAggregation { Single, Mean, Max };

struct ViewOptions {
  int layer = 0;          // selected layer (when !all_layers)
  bool all_layers = false;  // average the weights over every layer
  int head = 0;           // selected head (when aggregation == Single)
  HeadAggregation aggregation = HeadAggregation::Single;
  bool renormalize_sink = false;  // drop position 0 and renormalize the rest to sum 1
  bool color_by_v = false;        // color KV blocks by the V norm instead of K
  bool labels = true;
  int hovered_pos = -1;
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
std::vector<float> beam_weights(const StepTrace& t, const ViewOptions& opts);

render::Scene build_scene(const Timeline& tl, const ViewOptions& opts, const AnimClock& clock);

// Display text for a token label: newlines/tabs become visible symbols.
std::string display_text(const std::string& text);

}  // namespace kvscope::app
