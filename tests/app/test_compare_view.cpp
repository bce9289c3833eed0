// test_compare_view.cpp — the compare plots' numbers (app/core/compare_view.h) from hand-made
// runs of known cost, with no window and no model:
// - the per-step overhead the Plots section explains "time 6x when FLOPs are 30x" with is the
//   intercept of time against FLOPs over both runs' steps (steps cost 8 ms + 4 ms per GFLOP:
//   8 and 4 come back), and with it the time ratio stays far below the FLOPs ratio;
// - the measured − closed-form difference of the K/V rows is 0 for rows that follow the
//   closed forms, and says by how much when one step computed a row too many.
#include <gtest/gtest.h>

#include "app/core/compare_view.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

constexpr int kP = 20, kL = 4, kG = 40;
constexpr double kOverheadMs = 8.0, kMsPerGflop = 4.0;
constexpr double kFlopsPerRow = 5e6;  // a row of K/V through the model, all layers

// A run of kG steps on a kP-token prompt whose steps take exactly overhead + work.
RunSeries run_of(CacheMode mode) {
  RunSeries s;
  s.mode = mode;
  s.prompt_len = kP;
  for (int t = 1; t <= kG; ++t) {
    const int rows = mode == CacheMode::NoCache || t == 1 ? kP + t - 1 : 1;  // tokens through
    const double flops = kFlopsPerRow * (rows + 1);  // + the LM head, every step
    s.flops.push_back(flops);
    s.ms.push_back(kOverheadMs + kMsPerGflop * flops * 1e-9);
    s.kv_rows.push_back(uint64_t(rows) * kL);
    s.seq_len.push_back(kP + t);
    s.step_mode.push_back(mode);
  }
  return s;
}

}  // namespace

TEST(CompareView, TheMeasuredStepOverheadIsTheInterceptOfTimeAgainstFlops) {
  const RunSeries c = run_of(CacheMode::Cache), n = run_of(CacheMode::NoCache);
  const CompareView v = make_compare_view(&c, &n, kL);
  ASSERT_TRUE(v.ready);
  ASSERT_TRUE(v.overhead_fit);
  EXPECT_NEAR(v.step_overhead_ms, kOverheadMs, 1e-6);
  EXPECT_NEAR(v.ms_per_gflop, kMsPerGflop, 1e-6);
  // A KV CACHE decode step: 1 row and the LM head, 10 MFLOP = 0.04 ms of work on 8 ms.
  EXPECT_NEAR(v.cache_step_ms, kOverheadMs + kMsPerGflop * 0.010, 1e-6);
  // The story the note tells: FLOPs over ten times, time only a few times.
  EXPECT_GT(v.waste_flops, 10.0);
  EXPECT_LT(v.waste_time, v.waste_flops / 3.0);
}

TEST(CompareView, RowsFollowingTheClosedFormsDifferByNothingAndAnExtraRowIsSaid) {
  RunSeries c = run_of(CacheMode::Cache), n = run_of(CacheMode::NoCache);
  CompareView v = make_compare_view(&c, &n, kL);
  ASSERT_TRUE(v.ready);
  EXPECT_EQ(v.rows_residual_max, 0.0);
  n.kv_rows[10] += kL;  // step 11 recomputed one position too many, in every layer
  v = make_compare_view(&c, &n, kL);
  EXPECT_EQ(v.rows_residual_max, double(kL));
}

TEST(CompareView, NoOverheadIsClaimedFromTooFewSteps) {
  RunSeries c = run_of(CacheMode::Cache), n = run_of(CacheMode::NoCache);
  for (RunSeries* s : {&c, &n}) {
    s->ms.resize(2);
    s->flops.resize(2);
    s->kv_rows.resize(2);
    s->seq_len.resize(2);
    s->step_mode.resize(2);
  }
  const CompareView v = make_compare_view(&c, &n, kL);
  ASSERT_TRUE(v.ready);
  EXPECT_FALSE(v.overhead_fit);
}
