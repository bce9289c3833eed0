// plot_draw.h — small line plots with real axes for the Plots section: tick marks at round
// values labelled with units on both axes, optional log y axis, dashed or ringed guide
// lines, segments colored per point, a marker at one x, and a hover read-out of every series.
//
// Drawn with ImGui's draw list into the current window at the cursor, as one item of the
// given height and the available width, so it fits whatever column width the layout gives.
#pragma once

#include <imgui.h>

#include <cmath>
#include <string>
#include <vector>

namespace kvscope::app {

struct PlotSeries {
  const std::vector<double>* x = nullptr;  // [n] ascending
  const std::vector<double>* y = nullptr;  // [n]
  ImU32 color = IM_COL32(255, 255, 255, 255);
  const std::vector<ImU32>* colors = nullptr;  // [n] optional: segment i-1..i takes colors[i]
  float thickness = 2.0f;
  bool dashed = false;   // a guide (closed form), not a measurement
  std::string label;     // for the hover read-out
  bool markers = false;  // drawn as rings at (up to 24 of) its points, no line: a guide that
                         // lies on a measured line stays visible with it
};

enum class PlotUnit { Count, Milliseconds, Bytes };

struct PlotSpec {
  const char* id = "##plot";
  float height = 110.0f;
  const char* x_label = "";  // e.g. "SEQ_LEN" or "step"
  PlotUnit y_unit = PlotUnit::Count;
  const char* y_suffix = "";  // appended to count labels, e.g. " FLOP", " rows"
  bool log_y = false;
  double marker_x = NAN;  // a vertical marker (the viewed step), NaN for none
};

void draw_plot(const PlotSpec& spec, const std::vector<PlotSeries>& series);

// "1.5k rows", "12.3 ms", "4.2 MiB" as the axis labels write them.
std::string plot_value_label(double v, PlotUnit unit, const char* suffix);

}  // namespace kvscope::app
