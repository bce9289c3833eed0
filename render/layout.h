// layout.h — where things go in the world: the sequence along +x, the KV stack below
// each token (layer 0 at the top), the write head above the next slot.
//
// Shared by the app's scene building and the render tests so both agree on geometry.
// Pure functions of (index, count); no state.
#pragma once

#include <glm/vec3.hpp>

namespace kvscope::render::layout {

inline constexpr float kTokenSpacing = 1.0f;  // x distance between token centers
inline constexpr float kKvTop = -0.75f;       // y of layer 0's block center
inline constexpr float kKvPitch = 0.16f;      // y distance between layer blocks
inline constexpr float kHeadHeight = 1.6f;    // y of the write head above the tokens

inline glm::vec3 token_position(int pos) {
  return {pos * kTokenSpacing, 0.0f, 0.0f};
}

inline glm::vec3 kv_block_position(int pos, int layer) {
  return {pos * kTokenSpacing, kKvTop - layer * kKvPitch, 0.0f};
}

// A layer's KV block splits into one slice per KV head, side by side along x inside the
// kKvWidth a whole block takes (kKvHeadFill of each share is solid, the rest a gap).
inline constexpr float kKvWidth = 0.6f;
inline constexpr float kKvHeadFill = 0.8f;
inline glm::vec3 kv_head_position(int pos, int layer, int head, int n_heads) {
  if (n_heads <= 1) return kv_block_position(pos, layer);
  const float share = kKvWidth / float(n_heads);
  return kv_block_position(pos, layer) + glm::vec3(-0.5f * kKvWidth + (head + 0.5f) * share, 0, 0);
}
inline float kv_head_width(int n_heads) {
  return n_heads <= 1 ? kKvWidth : kKvWidth / float(n_heads) * kKvHeadFill;
}

// The write head floats above the slot it is about to fill.
inline glm::vec3 head_position(int next_pos) {
  return {next_pos * kTokenSpacing, kHeadHeight, 0.0f};
}

// Where a beam lands on a token: the middle of its top face.
inline glm::vec3 beam_target(int pos, float token_height) {
  return token_position(pos) + glm::vec3(0.0f, 0.5f * token_height, 0.0f);
}

// y of the floor under a stack of n_layer blocks.
inline float floor_height(int n_layer) {
  return kKvTop - n_layer * kKvPitch - 0.4f;
}

}  // namespace kvscope::render::layout
