// scene_kv.h — the KV cache part of the scene.
//
// Under every position, one block per layer, split into one slice per KV head (SmolLM2: 3,
// Gemma 3: 1), in x order (position, then KV head, then layer) so the renderer's culling
// holds. What a block shows comes from the viewed step's trace:
//   - which positions each layer's cache holds (StepTrace::kv_layers): a position a layer
//     no longer holds has no block; one it dropped in this very step (held by the step
//     before, or computed and dropped in this step) leaves with an animation (shrinks and
//     sinks: KvBlockInstance::leave);
//   - the window boundary of every layer that evicted something: a thin amber plate at the
//     layer's row just before the oldest position its window holds (green after a sink),
//     and a strip on the floor under it;
//   - the selected query head (single-head view) lights the KV head it reads and dims the
//     others, in every layer;
//   - a quantized K or V type hatches the blocks (kv_hatch).
// Traces without per-layer cache information (NO CACHE, recordings that lack it) show every
// computed position.
#pragma once

#include <string>
#include <vector>

#include "app/scene/scene_builder.h"
#include "app/core/timeline.h"
#include "render/scene.h"

namespace kvscope::app {

// Stripes per world unit that say a cache type is quantized: 8-bit blocks fine, 4-bit
// blocks coarse; 0 (plain) for f32 and f16.
float kv_hatch(KvDtype t);

// The quantization error colouring: a relative error ||x - stored(x)|| / ||x|| on a log
// scale from kKvErrorLow (0) to kKvErrorHigh (1), clamped (0 for no error at all), and its
// colour, dark to bright: navy (f16's ~1e-4), violet, magenta (q8_0's ~1e-2), pale pink
// (q4_0's ~1e-1 and above). No orange or red anywhere on it: those are the generated tokens'
// and NO CACHE's recompute colours, and a q4_0 stack must not blend into its token.
inline constexpr float kKvErrorLow = 1e-4f, kKvErrorHigh = 0.3f;
float kv_error_scale(float rel_error);
glm::vec3 kv_error_color(float rel_error);
inline constexpr glm::vec3 kKvErrorUnmeasured{0.32f, 0.33f, 0.36f};  // no measurement
// The measured error of layer `layer`'s K and V rows at `pos` of the viewed step, for the
// hover tooltip: "quantization error K 12% V 9.8% (layer 15)"; "" when not measured.
std::string kv_error_text(const Timeline& tl, int pos, int layer);

// The KV head that query head `head` reads: each KV head serves n_head / n_head_kv
// consecutive query heads (grouped-query attention; multi-query when n_head_kv is 1).
// -1 when the head or the shapes are out of range.
int kv_head_of(int head, int n_head, int n_head_kv);

enum class KvSlot {
  Held,     // in the layer's cache (or not computed yet, or no cache information)
  Leaving,  // dropped by this step: animates away
  Gone,     // dropped by an earlier step: not drawn
};

// Which positions each layer's cache holds after step `now`, and which it dropped in that
// step (`before` is the step before it, or null).
class KvHoldings {
 public:
  KvHoldings(const StepTrace* now, const StepTrace* before);
  KvSlot slot(int layer, int pos) const;
  // The oldest position after the sink that `layer` still holds when it has evicted some
  // (the window boundary), else -1; and the end of its sink (0 when none).
  int window_start(int layer) const;
  int sink_end(int layer) const;

 private:
  struct Layer {
    std::vector<KvRange> now, before;
  };
  std::vector<Layer> layers_;
  bool known_ = false;  // the trace says what each layer holds
  int written_first_ = 0, written_end_ = 0;
};

// The step shown before `tl`'s viewed step (null for the first).
const StepTrace* previous_trace(const Timeline& tl);

// Appends the KV blocks of positions [0, n_tok) and the window markers to `s`; sets the KV
// block size for the KV heads per layer in `opts`.
void add_kv_stacks(render::Scene* s, const Timeline& tl, const ViewOptions& opts, int n_tok,
                   int n_layer);

}  // namespace kvscope::app
