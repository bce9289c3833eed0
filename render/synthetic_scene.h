// synthetic_scene.h — deterministic scenes with no model behind them, for render tests
// and the render benchmark. Uses the same layout as the app's scene building.
#pragma once

#include <string>
#include <vector>

#include "render/camera.h"
#include "render/scene.h"

namespace kvscope::render {

struct SyntheticSpec {
  int n_tokens = 16;       // tokens in the sequence
  int n_prompt = 6;        // the first n_prompt are prompt tokens (dim)
  int n_layers = 6;        // KV blocks under each token
  bool recompute = false;  // NO CACHE look: every cached block flashes red
  bool labels = true;
  // Beam weights for positions [0, n_tokens); empty = a deterministic pattern
  // (a sink at 0, local decay, a few long-range spikes), normalized to max 1.
  std::vector<float> weights;
};

// Fills tokens, KV blocks, beams, head and grid; leaves scene.camera at its default.
Scene make_synthetic_scene(const SyntheticSpec& spec);

// The bounds of everything a scene draws (for camera framing).
Bounds scene_bounds(const Scene& scene);

// Shared palette (also used by the app).
namespace palette {
inline constexpr glm::vec3 kPromptToken{0.50f, 0.60f, 0.80f};
inline constexpr glm::vec3 kGeneratedToken{1.00f, 0.46f, 0.30f};
inline constexpr glm::vec3 kBeam{0.45f, 0.80f, 1.00f};
// KV blocks: a cool ramp by the normalized K/V norm in [0,1].
glm::vec3 kv_color(float t);
}  // namespace palette

}  // namespace kvscope::render
