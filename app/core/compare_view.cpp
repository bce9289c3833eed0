// compare_view.cpp — see compare_view.h.
#include "app/core/compare_view.h"

#include <algorithm>

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
  return v;
}

}  // namespace kvscope::app
