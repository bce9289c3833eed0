// compare_view.cpp — see compare_view.h.
#include "app/core/compare_view.h"

#include <algorithm>
#include <cmath>

namespace kvscope::app {

double cache_rows_closed_form(int p, int g) {
  return double(p) + double(g) - 1.0;
}
double nocache_rows_closed_form(int p, int g) {
  return double(g) * double(p) + double(g) * double(g - 1) / 2.0;
}

namespace {

CompareCurve curve(const RunSeries& s, int g) {
  CompareCurve c;
  double f = 0, ms = 0, rows = 0;
  for (int i = 0; i < g; ++i) {
    f += s.flops[size_t(i)];
    ms += s.ms[size_t(i)];
    rows += double(s.kv_rows[size_t(i)]);
    c.seq_len.push_back(double(s.seq_len[size_t(i)]));
    c.cum_flops.push_back(f);
    c.cum_ms.push_back(ms);
    c.cum_rows.push_back(rows);
  }
  return c;
}

// Least squares of ms against GFLOPs over the first g steps of both runs: the small KV
// CACHE steps and the large NO CACHE ones pin the line at both ends.
void fit_overhead(const RunSeries& a, const RunSeries& b, int g, CompareView* v) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const RunSeries* s : {&a, &b})
    for (int i = 0; i < g; ++i) {
      const double x = s->flops[size_t(i)] * 1e-9, y = s->ms[size_t(i)];
      n += 1;
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
  const double var = n * sxx - sx * sx;
  if (g < 3 || !(var > 1e-12 * std::max(1.0, sxx * n))) return;
  v->ms_per_gflop = (n * sxy - sx * sy) / var;
  v->step_overhead_ms = std::max(0.0, (sy - v->ms_per_gflop * sx) / n);
  v->overhead_fit = true;
}

}  // namespace

CompareView make_compare_view(const RunSeries* cache, const RunSeries* nocache, int n_layer) {
  CompareView v;
  v.n_layer = n_layer;
  if (!cache || !nocache || cache->mixed() || nocache->mixed()) return v;
  if (cache->prompt_len != nocache->prompt_len) return v;
  v.p = cache->prompt_len;
  v.g = int(std::min(cache->steps(), nocache->steps()));
  if (v.g < 1) return v;
  v.ready = true;
  v.cache = curve(*cache, v.g);
  v.nocache = curve(*nocache, v.g);
  for (int g = 1; g <= v.g; ++g) {
    v.guide_cache_rows.push_back(n_layer * cache_rows_closed_form(v.p, g));
    v.guide_nocache_rows.push_back(n_layer * nocache_rows_closed_form(v.p, g));
  }
  v.waste_formula = nocache_rows_closed_form(v.p, v.g) / cache_rows_closed_form(v.p, v.g);
  v.waste_seeds = nocache_rows_closed_form(v.p, v.g) / (double(v.p) + double(v.g));
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  v.waste_rows = ratio(v.nocache.cum_rows.back(), v.cache.cum_rows.back());
  v.waste_flops = ratio(v.nocache.cum_flops.back(), v.cache.cum_flops.back());
  v.waste_time = ratio(v.nocache.cum_ms.back(), v.cache.cum_ms.back());
  for (int i = 0; i < v.g; ++i)
    v.rows_residual_max = std::max(
        {v.rows_residual_max, std::abs(v.cache.cum_rows[size_t(i)] - v.guide_cache_rows[size_t(i)]),
         std::abs(v.nocache.cum_rows[size_t(i)] - v.guide_nocache_rows[size_t(i)])});
  fit_overhead(*cache, *nocache, v.g, &v);
  if (v.g >= 2) {
    double sum = 0;
    for (int i = 1; i < v.g; ++i) sum += cache->ms[size_t(i)];
    v.cache_step_ms = sum / double(v.g - 1);
  }
  return v;
}

}  // namespace kvscope::app
