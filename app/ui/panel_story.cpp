// panel_story.cpp — the story strip under the 3D view: what the product is named for, on
// screen at every window size without scrolling or opening anything.
//
// One line of read-outs (COMPUTE, KV_CACHE and SEQ_LEN of the viewed step, the same numbers
// as the Stats section, from stats_view.h; then the run's status), and under it the text so
// far following its newest words (hover a word to find it in 3D) beside the viewed step's
// top candidates. Each read-out is noted in ui.shown with its rectangle, for the tests.
// Draws content only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "app/core/stats_view.h"
#include "app/scene/scene_builder.h"
#include "app/ui/app_frame.h"
#include "app/ui/panel_text.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {
namespace {

const ImVec4 kAccent(1.0f, 0.62f, 0.35f, 1.0f);
const ImVec4 kRecompute(1.0f, 0.42f, 0.38f, 1.0f);

// The status of the run as the toolbar words it, shorter: what it is doing now.
std::string story_status(const UiState& ui, const ControllerState& cs, const Timeline& tl) {
  char buf[128];
  std::string s;
  if (cs.loading) {
    s = "opening...";
  } else if (cs.busy) {
    std::snprintf(buf, sizeof buf, "computing step %d... %.1f s", cs.computing_step,
                  cs.busy_seconds);
    s = buf;
  } else if (cs.finished && tl.last()) {
    s = finished_text(tl);
    if (s.empty()) s = std::string("finished (") + stop_reason_name(tl.last()->stop) + ")";
  } else if (cs.playing) {
    if (cs.speed <= kSpeedMax) {
      s = "playing, as fast as possible";
    } else {
      std::snprintf(buf, sizeof buf, "playing at %.2g tok/s", double(cs.speed));
      s = buf;
    }
  } else if (tl.last()) {
    s = "paused";
  }
  if (const std::string pending = pending_mode_text(tl, ui.mode); !pending.empty())
    s += (s.empty() ? "" : "; ") + pending;
  return s;
}

// The line of read-outs: one item per number, so each has its own tooltip.
void readouts(UiState& ui, const ControllerState& cs, const Timeline& tl) {
  const double target = cs.speed <= kSpeedMax ? 0.0 : double(cs.speed);
  const StatsView v = make_stats_view(tl, target, cs.playing, ui.facts.kv_bytes_per_token);
  const bool nocache = v.mode == CacheMode::NoCache;
  const float gap = ImGui::GetFontSize() * 1.2f;
  char buf[96];

  std::snprintf(buf, sizeof buf, "COMPUTE %s FLOP",
                v.has_step ? format_count(double(v.flops)).c_str() : "0");
  ImGui::TextColored(nocache ? kRecompute : kAccent, "%s", buf);
  note_shown(ui, "COMPUTE", buf);
  hover_tooltip(
      "Floating-point operations of step %d: %s K/V rows computed%s.\n"
      "%s FLOP since the start of the run. Stats (right column) has the details.",
      v.step, format_count(double(v.kv_rows)).c_str(),
      nocache ? ", the whole sequence again (NO CACHE)" : ", one per layer (KV CACHE)",
      format_count(double(v.flops_total)).c_str());

  ImGui::SameLine(0.0f, gap);
  if (nocache)
    std::snprintf(buf, sizeof buf, "KV_CACHE 0 B held");
  else
    std::snprintf(buf, sizeof buf, "KV_CACHE %s", format_bytes(v.kv_bytes).c_str());
  ImGui::TextColored(kAccent, "%s", buf);
  note_shown(ui, "KV_CACHE", buf);
  if (nocache)
    hover_tooltip("NO CACHE keeps nothing: this step recomputed %s of K and V and threw it away.",
                  format_bytes(v.kv_transient_bytes).c_str());
  else
    hover_tooltip("K and V held for %d positions, %s each (in whole blocks of the pool).",
                  v.kv_positions, format_bytes(v.kv_bytes_per_position).c_str());

  ImGui::SameLine(0.0f, gap);
  std::snprintf(buf, sizeof buf, "SEQ_LEN %d", v.seq_len);
  ImGui::TextColored(kAccent, "%s", buf);
  note_shown(ui, "SEQ_LEN", buf);
  hover_tooltip("Positions in the sequence after step %d: 0-%d.%s", v.step,
                std::max(v.seq_len - 1, 0), v.live ? "" : " (an older step: see History)");

  if (!v.live) {
    ImGui::SameLine(0.0f, gap);
    ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "step %d of %d", v.step, v.steps);
  }
  const std::string status = story_status(ui, cs, tl);
  if (!status.empty()) {
    ImGui::SameLine(0.0f, gap);
    const std::string shown = fit_text(status, ImGui::GetContentRegionAvail().x);
    ImGui::TextDisabled("%s", shown.c_str());
    if (shown != status) hover_tooltip("%s", status.c_str());
  }
}

// The viewed step's three likeliest next tokens, each over a bar of its probability.
void top_candidates(UiState& ui, const Timeline& tl, float width) {
  const StepTrace* t = tl.viewed();
  if (!t || t->top.empty()) {
    ImGui::TextDisabled("candidates: no step yet");
    return;
  }
  ImGui::TextDisabled("step %d chose from", t->step);
  hover_tooltip(
      "Step %d's likeliest tokens for position %d (probabilities after temperature);\n"
      "the one drawn is marked. Top candidates (right column) lists more.",
      t->step, t->pos);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float h = ImGui::GetTextLineHeight();
  for (size_t i = 0; i < std::min<size_t>(3, t->top.size()); ++i) {
    const Candidate& c = t->top[i];
    const bool sampled = int(i) == t->sampled_rank;
    const ImVec2 p = ImGui::GetCursorScreenPos();
    dl->AddRectFilled(p, ImVec2(p.x + width * std::clamp(c.p, 0.0f, 1.0f), p.y + h),
                      sampled ? IM_COL32(255, 128, 77, 110) : IM_COL32(90, 120, 170, 110), 2.0f);
    const std::string word = display_text(c.text);
    char pct[32];
    std::snprintf(pct, sizeof pct, "%5.1f%%", 100.0 * c.p);
    const std::string line =
        fit_text(std::string(pct) + "  '" + word + "'" + (sampled ? "  drawn" : ""), width);
    ImGui::TextUnformatted(line.c_str());
    if (i == 0) note_shown(ui, "top candidate", line);
  }
}

}  // namespace

void note_shown(UiState& ui, const char* what, std::string text) {
  note_shown(ui, what, std::move(text), ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
}

void note_shown(UiState& ui, const char* what, std::string text, ImVec2 min, ImVec2 max) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 c0 = dl->GetClipRectMin(), c1 = dl->GetClipRectMax();
  ui.shown.push_back({what, std::move(text), UiRect{min.x, min.y, max.x - min.x, max.y - min.y},
                      UiRect{c0.x, c0.y, c1.x - c0.x, c1.y - c0.y}});
}

void panel_story(UiState& ui, const ControllerState& cs, const Timeline& tl) {
  readouts(ui, cs, tl);
  const ImGuiStyle& st = ImGui::GetStyle();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float cand_w = std::clamp(avail.x * 0.34f, 150.0f * ui_scale(), 300.0f * ui_scale());
  panel_transcript(ui, tl, ImVec2(avail.x - cand_w - st.ItemSpacing.x, avail.y));
  ImGui::SameLine();
  ImGui::BeginGroup();
  top_candidates(ui, tl, cand_w);
  ImGui::EndGroup();
}

}  // namespace kvscope::app
