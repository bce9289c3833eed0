// expected_layout.h — where the pixel tests expect things in the world, written out here
// from the scene's documented geometry (render/layout.h's header and constants, as a user
// sees it: tokens 1 unit apart along +x at y = 0; each token's KV stack below it, layer 0's
// block at y = -0.75 and one layer every 0.16 down, a block 0.6 wide split into one slice
// per KV head of which 80% is solid; the write head 1.6 above the next slot), not taken
// from render::layout. A layout bug then moves the picture and not the expectation with it;
// LayoutSpec.ProductionLayoutMatchesTheSpec (test_camera_atlas.cpp) says which number moved.
//
// The same names as render::layout, so a test switches with one namespace alias.
#pragma once

#include <glm/vec3.hpp>

namespace kvscope::test::expected_layout {

inline constexpr float kTokenSpacing = 1.0f;
inline constexpr float kKvTop = -0.75f;
inline constexpr float kKvPitch = 0.16f;
inline constexpr float kHeadHeight = 1.6f;
inline constexpr float kKvWidth = 0.6f;
inline constexpr float kKvHeadFill = 0.8f;

inline glm::vec3 token_position(int pos) {
  return {float(pos) * kTokenSpacing, 0.0f, 0.0f};
}

inline glm::vec3 kv_block_position(int pos, int layer) {
  return {float(pos) * kTokenSpacing, kKvTop - float(layer) * kKvPitch, 0.0f};
}

// Head g of n: the centre of the g-th of n equal shares of the block's width, left to right.
inline glm::vec3 kv_head_position(int pos, int layer, int head, int n_heads) {
  const glm::vec3 block = kv_block_position(pos, layer);
  if (n_heads <= 1) return block;
  const float share = kKvWidth / float(n_heads);
  return {block.x - 0.5f * kKvWidth + (float(head) + 0.5f) * share, block.y, block.z};
}

inline glm::vec3 head_position(int next_pos) {
  return {float(next_pos) * kTokenSpacing, kHeadHeight, 0.0f};
}

}  // namespace kvscope::test::expected_layout
