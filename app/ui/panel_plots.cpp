// panel_plots.cpp — the Plots section.
//
// First the compute story, once both modes have run on this prompt (Compare modes does it in
// one click): cumulative K/V rows, FLOPs and time against SEQ_LEN for KV CACHE (blue) and
// NO CACHE (orange), the closed forms drawn dashed as guides on the rows plot, and
// the waste factor as the formula and as measured. Then this run's measured per-step time
// and FLOPs (the other mode's earlier run on the same prompt overlaid thin), and the KV
// bytes per step. Every solid curve is measured; only the dashed guides come from a formula.
// Draws content only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "app/core/compare_view.h"
#include "app/ui/panel_text.h"
#include "app/ui/plot_draw.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

const ImU32 kCacheCol = IM_COL32(110, 190, 255, 255);
const ImU32 kNoCacheCol = IM_COL32(255, 135, 70, 255);
const ImU32 kGuideCol = IM_COL32(200, 200, 210, 200);
ImU32 mode_color(CacheMode m) {
  return m == CacheMode::Cache ? kCacheCol : kNoCacheCol;
}
ImVec4 v4(ImU32 c) {
  return ImGui::ColorConvertU32ToFloat4(c);
}

void legend_item(ImU32 col, const char* text, bool dashed = false) {
  ImGui::TextColored(v4(col), dashed ? "- -" : "---");
  ImGui::SameLine(0, 4);
  ImGui::TextUnformatted(text);
}

void compare_section(UiState& ui, const Timeline& tl) {
  const RunSeries* c = tl.history().find(tl.prompt_text(), tl.prompt_chat(), CacheMode::Cache);
  const RunSeries* n = tl.history().find(tl.prompt_text(), tl.prompt_chat(), CacheMode::NoCache);
  const CompareView v = make_compare_view(c, n, ui.facts.n_layer);
  if (!v.ready) {
    ImGui::TextWrapped(
        "Compare modes (in Controls) runs this prompt with and without the KV "
        "cache and draws both here.");
    return;
  }
  ImGui::TextWrapped("p = %d prompt tokens, g = %d steps, L = %d layers%s", v.p, v.g, v.n_layer,
                     tl.compare_phase() == ComparePhase::Interleaved ? " (run interleaved)" : "");
  ImGui::TextWrapped("waste factor (g·p + g(g-1)/2) / (p + g - 1) = %.1fx", v.waste_formula);
  hover_tooltip(
      "K/V rows per layer: NO CACHE recomputes p + t - 1 rows at step t,\n"
      "g·p + g(g-1)/2 in all; KV CACHE computes each row once, p + g - 1 in\n"
      "all (the usual form is p + g, which counts the newest token too: %.1fx).",
      v.waste_seeds);
  ImGui::TextWrapped("measured: K/V rows %.1fx, FLOPs %.1fx, time %.1fx", v.waste_rows,
                     v.waste_flops, v.waste_time);
  hover_tooltip(
      "Ratios of the two runs' totals. FLOPs grow less than rows because the\n"
      "LM head runs once per step in both modes; time also pays for memory.");
  legend_item(kCacheCol, "KV CACHE");
  ImGui::SameLine();
  legend_item(kNoCacheCol, "NO CACHE");
  legend_item(kGuideCol, "closed form", true);
  ImGui::SameLine();
  ImGui::Checkbox("log scale", &ui.plots_log_y);

  std::vector<double> guide_x = v.cache.seq_len;
  auto pair = [&](const std::vector<double>& a, const std::vector<double>& b) {
    return std::vector<PlotSeries>{
        {&v.nocache.seq_len, &b, kNoCacheCol, nullptr, 2.0f, false, "NO CACHE"},
        {&v.cache.seq_len, &a, kCacheCol, nullptr, 2.0f, false, "KV CACHE"}};
  };
  ImGui::TextDisabled("K/V rows computed, cumulative");
  std::vector<PlotSeries> rows = pair(v.cache.cum_rows, v.nocache.cum_rows);
  rows.push_back(
      {&guide_x, &v.guide_nocache_rows, kGuideCol, nullptr, 1.5f, true, "L·(g·p + g(g-1)/2)"});
  rows.push_back({&guide_x, &v.guide_cache_rows, kGuideCol, nullptr, 1.5f, true, "L·(p + g - 1)"});
  PlotSpec ps;
  ps.height = 72.0f;  // the three plots fit under the section's header at 1280x720
  ps.id = "##cmp_rows";
  ps.x_label = "SEQ_LEN";
  ps.y_suffix = "";
  ps.log_y = ui.plots_log_y;
  draw_plot(ps, rows);
  ImGui::TextDisabled("FLOPs, cumulative");
  ps.id = "##cmp_flops";
  ps.y_suffix = "";
  draw_plot(ps, pair(v.cache.cum_flops, v.nocache.cum_flops));
  ImGui::TextDisabled("engine time, cumulative");
  ps.id = "##cmp_ms";
  ps.y_unit = PlotUnit::Milliseconds;
  draw_plot(ps, pair(v.cache.cum_ms, v.nocache.cum_ms));
}

// One run's per-step series as plot columns (x = step number, colors by each step's mode).
struct StepColumns {
  std::vector<double> x, ms, flops;
  std::vector<ImU32> colors;
};
StepColumns columns(const RunSeries& s) {
  StepColumns c;
  for (size_t i = 0; i < s.steps(); ++i) {
    c.x.push_back(double(i + 1));
    c.ms.push_back(s.ms[i]);
    c.flops.push_back(s.flops[i]);
    c.colors.push_back(mode_color(s.step_mode[i]));
  }
  return c;
}

void run_section(const UiState& ui, const Timeline& tl) {
  const RunSeries* cur = tl.current_series();
  const RunSeries* other = tl.other_series();
  if (!cur) {
    ImGui::TextDisabled("no steps yet in this run");
    return;
  }
  StepColumns a = columns(*cur), b = other ? columns(*other) : StepColumns{};
  std::vector<PlotSeries> ms, fl;
  if (other) {
    ms.push_back({&b.x, &b.ms, mode_color(other->mode), &b.colors, 1.2f, false, "earlier run"});
    fl.push_back({&b.x, &b.flops, mode_color(other->mode), &b.colors, 1.2f, false, "earlier run"});
  }
  ms.push_back({&a.x, &a.ms, mode_color(cur->mode), &a.colors, 2.5f, false, "this run"});
  fl.push_back({&a.x, &a.flops, mode_color(cur->mode), &a.colors, 2.5f, false, "this run"});
  ImGui::TextDisabled("this run%s: %zu steps", cur->mixed() ? " (switched modes)" : "",
                      cur->steps());
  if (other) {
    ImGui::SameLine();
    ImGui::TextDisabled("; thin: the %s run on this prompt",
                        other->mode == CacheMode::Cache ? "KV CACHE" : "NO CACHE");
  }
  PlotSpec ps;
  ps.x_label = "step";
  ps.height = 95.0f;
  ps.marker_x = tl.live() ? NAN : double(tl.viewed_step());
  ImGui::TextDisabled("time per step (measured)");
  ps.id = "##ms";
  ps.y_unit = PlotUnit::Milliseconds;
  ps.log_y = ui.plots_log_y;
  draw_plot(ps, ms);
  ImGui::TextDisabled("FLOPs per step (measured)");
  ps.id = "##flops";
  ps.y_unit = PlotUnit::Count;
  draw_plot(ps, fl);

  // KV bytes of this run: held by the cache plus recomputed-and-discarded (NO CACHE).
  std::vector<double> x, kv;
  std::vector<ImU32> kc;
  for (const auto& sp : tl.steps()) {
    x.push_back(double(sp->step));
    kv.push_back(double(sp->kv_bytes + sp->kv_transient_bytes));
    kc.push_back(mode_color(sp->mode));
  }
  ImGui::TextDisabled("KV bytes per step (held + recomputed)");
  ps.id = "##kv";
  ps.y_unit = PlotUnit::Bytes;
  ps.log_y = false;
  ps.height = 70.0f;
  draw_plot(ps, {{&x, &kv, IM_COL32(120, 230, 190, 255), &kc, 2.0f, false, "KV bytes"}});
}

}  // namespace

void panel_plots(UiState& ui, const Timeline& tl) {
  compare_section(ui, tl);
  ImGui::Separator();
  run_section(ui, tl);
}

}  // namespace kvscope::app
