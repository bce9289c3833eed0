// panel_plots.cpp — the Plots section.
//
// First the compute story, once both modes have run on this prompt (Compare modes does it in
// one click): cumulative K/V rows, FLOPs and time against SEQ_LEN for KV CACHE (blue) and
// NO CACHE (orange), the closed forms drawn as rings on the rows plot (they lie on the
// measured lines, so a dashed line hid under them) with the largest difference said, the
// waste factor as the formula and as measured, and why time grows less than FLOPs (the
// measured per-step overhead). Then this run's measured per-step time and FLOPs (the other
// mode's run on the same prompt overlaid thin), and the KV bytes per step held and
// recomputed, two lines. Every line is measured; only the rings come from a formula.
// The section draws into the right column, and into a large window of its own (Large view)
// with every plot taller. Draws content only (see app_frame.cpp).
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
const ImU32 kGuideCol = IM_COL32(235, 235, 245, 230);
const ImU32 kHeldCol = IM_COL32(120, 230, 190, 255);
const ImU32 kRecomputedCol = IM_COL32(255, 95, 90, 255);
ImU32 mode_color(CacheMode m) {
  return m == CacheMode::Cache ? kCacheCol : kNoCacheCol;
}
ImVec4 v4(ImU32 c) {
  return ImGui::ColorConvertU32ToFloat4(c);
}

void legend_item(ImU32 col, const char* text, bool rings = false) {
  ImGui::TextColored(v4(col), rings ? "o o" : "---");
  ImGui::SameLine(0, 4);
  ImGui::TextUnformatted(text);
}

// Plot heights: the column's (small), or those of the large window.
struct PlotHeights {
  float compare = 72.0f;  // the three compare plots fit under the header at 1280x720
  float step = 95.0f;
  float kv = 70.0f;
};

void compare_section(UiState& ui, const Timeline& tl, const PlotHeights& hs) {
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
  if (v.overhead_fit) {
    // Why time is a few times when FLOPs are tens of times: the fixed cost of a step.
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyle().Colors[ImGuiCol_TextDisabled]);
    ImGui::TextWrapped(
        "time %.1fx, not %.1fx: every step pays about %.1f ms whatever its size, and a KV "
        "CACHE step takes %.1f ms in all: small steps are overhead-bound",
        v.waste_time, v.waste_flops, v.step_overhead_ms, v.cache_step_ms);
    ImGui::PopStyleColor();
    hover_tooltip(
        "A straight line through both runs' steps, time against FLOPs:\n"
        "  step time = %.2f ms + %.2f ms per GFLOP.\n"
        "Its intercept is what a step costs whatever its size (the weights read for\n"
        "one token, sampling, dispatch, the trace the app records), paid by both\n"
        "modes at every step. A KV CACHE step has few FLOPs, so its time is mostly\n"
        "that, and the time ratio stays far below the FLOPs ratio until the\n"
        "sequence is long.",
        v.step_overhead_ms, v.ms_per_gflop);
  }
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
  rows.push_back({&guide_x, &v.guide_nocache_rows, kGuideCol, nullptr, 1.5f, false,
                  "L·(g·p + g(g-1)/2)", true});
  rows.push_back(
      {&guide_x, &v.guide_cache_rows, kGuideCol, nullptr, 1.5f, false, "L·(p + g - 1)", true});
  PlotSpec ps;
  ps.height = hs.compare;
  ps.id = "##cmp_rows";
  ps.x_label = "SEQ_LEN";
  ps.y_suffix = "";
  ps.log_y = ui.plots_log_y;
  draw_plot(ps, rows);
  // The rings sit on the lines: say how far apart they are.
  const bool equal = v.rows_residual_max == 0;
  ImGui::PushStyleColor(ImGuiCol_Text, equal ? ImGui::GetStyle().Colors[ImGuiCol_TextDisabled]
                                             : ImVec4(1.0f, 0.8f, 0.3f, 1.0f));
  if (equal)
    ImGui::TextWrapped("rings on the lines: measured = closed form at every step (0 rows apart)");
  else
    ImGui::TextWrapped("measured - closed form: up to %.0f rows apart", v.rows_residual_max);
  ImGui::PopStyleColor();
  ImGui::TextDisabled("FLOPs, cumulative");
  ps.id = "##cmp_flops";
  ps.height = hs.compare;
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

void run_section(const UiState& ui, const Timeline& tl, const PlotHeights& hs) {
  const RunSeries* cur = tl.current_series();
  const RunSeries* other = tl.other_series();
  if (!cur) {
    ImGui::TextDisabled("no steps yet in this run");
    return;
  }
  StepColumns a = columns(*cur), b = other ? columns(*other) : StepColumns{};
  std::vector<PlotSeries> ms, fl;
  // The other run is named by its mode: in an interleaved comparison it ran alongside this
  // one, not before it.
  const std::string other_name =
      other ? std::string(other->mode == CacheMode::Cache ? "KV CACHE" : "NO CACHE") + " run" : "";
  if (other) {
    ms.push_back({&b.x, &b.ms, mode_color(other->mode), &b.colors, 1.2f, false, other_name});
    fl.push_back({&b.x, &b.flops, mode_color(other->mode), &b.colors, 1.2f, false, other_name});
  }
  ms.push_back({&a.x, &a.ms, mode_color(cur->mode), &a.colors, 2.5f, false, "this run"});
  fl.push_back({&a.x, &a.flops, mode_color(cur->mode), &a.colors, 2.5f, false, "this run"});
  ImGui::TextDisabled("this run%s: %zu steps", cur->mixed() ? " (switched modes)" : "",
                      cur->steps());
  if (other) {
    ImGui::SameLine(0.0f, 0.0f);
    ImGui::TextDisabled("; thin: the %s run on this prompt",
                        other->mode == CacheMode::Cache ? "KV CACHE" : "NO CACHE");
  }
  PlotSpec ps;
  ps.x_label = "step";
  ps.height = hs.step;
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

  // KV bytes of this run, two lines: held by the cache, and recomputed then discarded
  // (NO CACHE steps; 0 in KV CACHE).
  std::vector<double> x, held, recomputed;
  for (const auto& sp : tl.steps()) {
    x.push_back(double(sp->step));
    held.push_back(double(sp->kv_bytes));
    recomputed.push_back(double(sp->kv_transient_bytes));
  }
  ImGui::TextDisabled("KV bytes per step:");
  ImGui::SameLine();
  legend_item(kHeldCol, "held");
  ImGui::SameLine();
  legend_item(kRecomputedCol, "recomputed");
  ps.id = "##kv";
  ps.y_unit = PlotUnit::Bytes;
  ps.log_y = false;
  ps.height = hs.kv;
  draw_plot(ps, {{&x, &recomputed, kRecomputedCol, nullptr, 2.0f, false, "recomputed"},
                 {&x, &held, kHeldCol, nullptr, 2.0f, false, "held"}});
}

}  // namespace

void panel_plots(UiState& ui, const Timeline& tl) {
  if (ImGui::SmallButton(ui.plots_window ? "Large view (open)" : "Large view"))
    ui.plots_window = !ui.plots_window;
  hover_tooltip("The same plots in a window of their own, side by side and taller");
  compare_section(ui, tl, PlotHeights{});
  ImGui::Separator();
  run_section(ui, tl, PlotHeights{});
}

void panel_plots_window(UiState& ui, const Timeline& tl) {
  if (!ui.plots_window) return;
  const ImGuiIO& io = ImGui::GetIO();
  ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x * 0.5f, io.DisplaySize.y * 0.5f),
                          ImGuiCond_Appearing, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSize(ImVec2(io.DisplaySize.x * 0.86f, io.DisplaySize.y * 0.86f),
                           ImGuiCond_Appearing);
  if (ImGui::Begin("Plots###plots_window", &ui.plots_window,
                   ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoCollapse)) {
    // Two columns: the comparison, this run. The plots share the window's height.
    const float lh = ImGui::GetTextLineHeightWithSpacing();
    const float avail = ImGui::GetContentRegionAvail().y;
    PlotHeights hs;
    hs.compare = std::max(72.0f, (avail - 12.0f * lh) / 3.0f);
    hs.step = std::max(95.0f, (avail - 4.0f * lh) * 0.37f);
    hs.kv = std::max(70.0f, (avail - 4.0f * lh) * 0.24f);
    if (ImGui::BeginTable("##plots_columns", 2, ImGuiTableFlags_BordersInnerV)) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      compare_section(ui, tl, hs);
      ImGui::TableNextColumn();
      run_section(ui, tl, hs);
      ImGui::EndTable();
    }
  }
  ImGui::End();
}

}  // namespace kvscope::app
