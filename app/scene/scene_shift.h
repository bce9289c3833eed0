// scene_shift.h — a context shift as the scene shows it.
//
// A step with StepTrace::shift_n > 0 first dropped positions [shift_first, shift_first + n)
// and moved every later position down by n (its K row re-rotated). Drawn from that step's
// trace and the one before it, over the seconds after the step arrived:
//   - the kept positions [0, shift_first) stay put;
//   - the dropped ones leave where they stood (their token and cache blocks shrink and
//     sink away: the eviction look of sink + window and Gemma 3's windows);
//   - the survivors start at their old positions (n slots to the right) and slide left
//     into their new ones over kShiftSlideSeconds, eased (SceneAnim::slide); the token the
//     step wrote lands at the end of the old sequence and slides with them, and so does the
//     write head; the beams (the step's attention over the new positions) wait for the
//     slide to end;
//   - a green strip on the floor marks where the kept positions end.
// Everything is per-frame animation of instance data built once per step: the engine is
// never waited on.
#pragma once

#include <vector>

#include "app/scene/scene_builder.h"
#include "app/core/timeline.h"
#include "render/scene.h"

namespace kvscope::app {

inline constexpr double kShiftSlideDelay = 0.1;    // the dropped blocks start leaving first
inline constexpr double kShiftSlideSeconds = 0.4;  // then the survivors slide

// The shift the viewed step did (n == 0: none).
struct ShiftLook {
  int first = 0, n = 0;
  bool active() const { return n > 0; }
  // World units along +x a position of the viewed step starts from (0: it does not move).
  float slide_of(int pos) const;
};
ShiftLook viewed_shift(const Timeline& tl);

// SceneAnim::slide (the fraction of the slide still to travel) `since` seconds after the
// step arrived: 1 until kShiftSlideDelay, eased down to 0 by kShiftSlideDelay +
// kShiftSlideSeconds.
float shift_slide_left(double since);

// SceneAnim::leave on a shift step: the dropped positions are gone by the time the
// survivors arrive.
float shift_leave_progress(double since);

// The held ranges of the step before a shift, renumbered as after it: the part before
// `first` stays, [first, first + n) is gone, the rest moves down by n.
std::vector<KvRange> ranges_after_shift(const std::vector<KvRange>& before, int first, int n);

// Appends the dropped positions' tokens and KV blocks (leaving, at their old places) and the
// kept-positions marker. Ghost instances go after the others, so the tokens vector stays
// indexed by position.
void add_shift_ghosts(render::Scene* s, const Timeline& tl, const ViewOptions& opts,
                      const ShiftLook& shift, int n_layer);

}  // namespace kvscope::app
