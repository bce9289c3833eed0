// compare_view.h — the compute story in numbers: one prompt run with and without the KV
// cache, as cumulative curves against SEQ_LEN, with the closed forms of docs/design.md as guides.
//
// After g steps on a p-token prompt, per layer:
//   KV CACHE  computes K/V for the prompt once and for each token fed back since:
//             p + g − 1 rows (the usual form is p + g, counting the newest token, whose K/V
//             the next step computes);
//   NO CACHE  step t recomputes all p + t − 1 rows: g·p + g(g−1)/2 in all.
// The waste factor is their ratio, shown as the formula and as measured (K/V rows, FLOPs and
// time actually reported by the two runs). Nothing here is estimated except the guides,
// which are drawn as guides. Pure data: the Plots panel draws it; tests check it.
#pragma once

#include <vector>

#include "app/core/run_history.h"

namespace kvscope::app {

struct CompareCurve {
  std::vector<double> seq_len;    // [steps] x: SEQ_LEN after each step
  std::vector<double> cum_flops;  // [steps] FLOPs since the run began
  std::vector<double> cum_ms;     // [steps] engine milliseconds since the run began
  std::vector<double> cum_rows;   // [steps] K/V rows computed since the run began
};

struct CompareView {
  bool ready = false;  // both modes have run on this prompt
  int p = 0;           // prompt tokens
  int g = 0;           // steps both runs took (the shorter one)
  int n_layer = 0;
  CompareCurve cache, nocache;
  std::vector<double> guide_cache_rows, guide_nocache_rows;  // [g] L·(p+g−1), L·(g·p+g(g−1)/2)
  double waste_formula = 0;                                  // (g·p + g(g−1)/2) / (p + g − 1)
  double waste_seeds = 0;  // (g·p + g(g−1)/2) / (p + g), the closed form
  double waste_rows = 0;   // measured: NO CACHE rows / CACHE rows over the g steps
  double waste_flops = 0;  // measured FLOPs ratio
  double waste_time = 0;   // measured time ratio
  // measured − closed form of the cumulative K/V rows, the largest |difference| over both
  // runs' steps (0: they agree at every step, as they must)
  double rows_residual_max = 0;
  // Why time grows less than FLOPs: a least-squares line through both runs' steps,
  // ms = step_overhead_ms + ms_per_gflop · GFLOPs. Its intercept is what every step costs
  // whatever its size (weights read for one token, sampling, dispatch, the trace); a KV
  // CACHE step does little else, so the small steps are overhead-bound. `overhead_fit`: at
  // least three steps a run, of different sizes, to fit (the intercept is clamped at 0).
  bool overhead_fit = false;
  double step_overhead_ms = 0;
  double ms_per_gflop = 0;
  double cache_step_ms = 0;  // the KV CACHE run's mean step time after its first step
};

// Closed forms per layer after g steps on a p-token prompt.
double cache_rows_closed_form(int p, int g);
double nocache_rows_closed_form(int p, int g);

// From the measured series of the two modes on one prompt (either may be null).
CompareView make_compare_view(const RunSeries* cache, const RunSeries* nocache, int n_layer);

}  // namespace kvscope::app
