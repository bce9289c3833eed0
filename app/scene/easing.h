// easing.h — the scene's one easing curve for its short animations (drops, fades).
#pragma once

#include <algorithm>

namespace kvscope::app {

// 0 below 0, 1 above 1, and the smoothstep curve 3x^2 - 2x^3 between: no jump in speed
// at either end.
inline float smooth01(float x) {
  x = std::clamp(x, 0.0f, 1.0f);
  return x * x * (3.0f - 2.0f * x);
}

}  // namespace kvscope::app
