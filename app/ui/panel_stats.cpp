// panel_stats.cpp — COMPUTE, KV_CACHE, SEQ_LEN and timing, as defined in docs/design.md
// ("The numbers, exactly"), for the
// viewed step (the newest one unless the history slider chose another). Every number comes
// from stats_view.h, so they agree with each other: positions one way, the per-position KV
// size exact, time to first token and prefill apart from decode, delivered <= engine, and
// the target speed shown when the engine cannot reach it. Draws content only, into the
// region the layout gives it (see app_frame.cpp).
#include <imgui.h>

#include <algorithm>
#include <string>

#include "app/ui/panel_text.h"
#include "app/core/stats_view.h"
#include "app/ui/ui_state.h"

namespace kvscope::app {

void panel_stats(const UiState& ui, const ControllerState& cs, const Timeline& tl) {
  ImGuiIO& io = ImGui::GetIO();
  const ImVec4 accent(1.0f, 0.62f, 0.35f, 1.0f), warn(1.0f, 0.8f, 0.3f, 1.0f);
  const double target = cs.speed <= kSpeedMax ? 0.0 : double(cs.speed);
  const StatsView v = make_stats_view(tl, target, cs.playing, ui.facts.kv_bytes_per_token);
  const bool nocache = v.mode == CacheMode::NoCache;

  ImGui::TextColored(accent, "MODE      %s", nocache ? "NO CACHE" : "KV CACHE");
  if (!v.live) {
    ImGui::SameLine();
    ImGui::TextColored(warn, "  (step %d of %d)", v.step, v.steps);
  }
  // The toolbar's choice before it takes effect: the same words the toolbar shows.
  if (const std::string pending = pending_mode_text(tl, ui.mode); !pending.empty()) {
    ImGui::TextColored(warn, "          %s", pending.c_str());
    hover_tooltip(
        "The mode changes between two steps: the numbers below are still\n"
        "those of a %s step.",
        tl.last() && tl.last()->mode == CacheMode::NoCache ? "NO CACHE" : "KV CACHE");
  }
  if (cs.busy)
    ImGui::TextColored(warn, "          computing step %d... %.1f s", cs.computing_step,
                       cs.busy_seconds);
  if (v.has_step) {
    ImGui::TextColored(accent, "COMPUTE   %s FLOP this step",
                       format_count(double(v.flops)).c_str());
    ImGui::Text("          %s FLOP in all", format_count(double(v.flops_total)).c_str());
    ImGui::Text("          %llu K/V rows, %llu in all", static_cast<unsigned long long>(v.kv_rows),
                static_cast<unsigned long long>(v.kv_rows_total));
    if (!nocache) {
      ImGui::TextColored(accent, "KV_CACHE  %s", format_bytes(v.kv_bytes).c_str());
      if (v.kv_positions_min == v.kv_positions) {
        if (v.kv_slots > 0 && v.kv_slots != v.kv_positions)
          ImGui::Text("          %d positions in %d slots x %s", v.kv_positions, v.kv_slots,
                      format_bytes(v.kv_bytes_per_position).c_str());
        else
          ImGui::Text("          %d positions x %s", v.kv_positions,
                      format_bytes(v.kv_bytes_per_position).c_str());
      } else {
        ImGui::Text("          %d-%d positions per layer", v.kv_positions_min, v.kv_positions);
      }
      hover_tooltip(
          "The cache takes its K/V rows from a pool in blocks of a fixed number of positions\n"
          "(--kv-block, 16 by default); KV_CACHE counts the blocks held, the last one partly\n"
          "used. Windowed layers give a block back once no later query sees any of it.\n"
          "Positions held per layer: %d to %d; slots in the blocks held: %llu (layer x\n"
          "position pairs); %s per layer and position.",
          v.kv_positions_min, v.kv_positions, static_cast<unsigned long long>(v.kv_layer_slots),
          format_bytes(v.kv_bytes_per_row).c_str());
    } else {
      ImGui::TextColored(accent, "KV_CACHE  0 B held");
      ImGui::Text("          %s recomputed, discarded", format_bytes(v.kv_transient_bytes).c_str());
    }
  } else {
    ImGui::TextDisabled("no steps yet: press Play or Step");
    ImGui::TextColored(accent, "KV_CACHE  0 B");
  }
  // Next to KV_CACHE: what the whole app holds (model file pages, cache, history, UI).
  ImGui::Text("          app: %s resident",
              ui.rss_bytes ? format_bytes(ui.rss_bytes).c_str() : "?");
  hover_tooltip(
      "Resident memory of the kvscope process: the model file's pages in use,\n"
      "the KV cache, the run's history (older steps live in a spool on disk)\n"
      "and the UI. Reset gives back what the old run held.");
  if (v.has_step) {
    ImGui::TextColored(accent, "SEQ_LEN   %d", v.seq_len);
    ImGui::SameLine();
    ImGui::TextDisabled(" positions 0-%d", v.seq_len - 1);
    ImGui::Text("step %-5d wrote position %d", v.step, v.write_pos);
    hover_tooltip("Its query was the token at position %d; positions count from 0.", v.query_pos);
    if (const StepTrace* t = tl.viewed(); t && t->shift_n > 0) {
      ImGui::TextColored(ImVec4(0.45f, 0.95f, 0.55f, 1.0f),
                         "          context shift: dropped %d-%d", t->shift_first,
                         t->shift_first + t->shift_n - 1);
      hover_tooltip(
          "The context was full: this step kept positions 0-%d, dropped the next %d and\n"
          "moved every later one down by %d (their K rows re-rotated); %d dropped since\n"
          "the start of the run",
          t->shift_first - 1, t->shift_n, t->shift_n, t->shifted_total);
    }
    ImGui::Text("          %.1f ms%s for %d token%s", v.step_ms, v.device_time ? " (GPU)" : "",
                v.tokens_processed, v.tokens_processed == 1 ? "" : "s");
    hover_tooltip(
        "Tokens through the forward this step: the prompt at step 1, then one\n"
        "(KV CACHE) or the whole sequence (NO CACHE).");
  }

  // Speed: the first step (the prompt's prefill in KV CACHE mode) apart from the rest.
  const SpeedStats& s = v.speed;
  if (s.ttft_ms >= 0) {
    ImGui::Text("1st token %.0f ms", s.ttft_ms);
    hover_tooltip("Time to first token: step 1 runs the whole prompt through the model.");
    ImGui::Text("prefill   %d tokens, %.0f tok/s", s.prefill_tokens, s.prefill_tok_s);
  }
  if (s.window >= 1) {
    const char* mode = s.mode == CacheMode::NoCache ? "NO CACHE" : "KV CACHE";
    const char* other = s.mode == CacheMode::NoCache ? "KV CACHE" : "NO CACHE";
    if (s.window >= 2)
      ImGui::Text("decode    %.1f tok/s, %.1f delivered", s.engine_tok_s, s.delivered_tok_s);
    else
      ImGui::Text("decode    %.1f tok/s", s.engine_tok_s);
    hover_tooltip(
        "%s steps only (since step %d), over the last %d after the first:\n"
        "tokens per second of engine time, then (delivered) per second of wall time between\n"
        "steps (pacing, drawing; in an interleaved comparison, the NO CACHE\n"
        "run's steps in between). Switching the mode starts the count again.",
        mode, s.mode_since, s.window);
    if (s.other_engine_tok_s > 0) {
      ImGui::TextDisabled("          %s steps; %s ran %.1f tok/s", mode, other,
                          s.other_engine_tok_s);
      hover_tooltip("The engine rate of this run's %s steps before the switch to %s.", other, mode);
    }
  }
  if (v.behind) {
    ImGui::TextColored(warn, "target    %.1f tok/s: the engine delivers %.1f", v.target_tok_s,
                       s.delivered_tok_s);
    hover_tooltip(
        "The engine cannot keep up with the chosen pace: each step takes\n"
        "longer than 1/%.1f s. Lower the pace or use KV CACHE.",
        v.target_tok_s);
  }

  ImGui::Separator();
  ImGui::TextWrapped("model     %s", model_display_name(ui.facts.name, ui.facts.file_name).c_str());
  hover_tooltip("%s\nfile %s", ui.facts.name.c_str(), ui.facts.file_name.c_str());
  ImGui::Text("backend   %s", ui.replay ? "(a recording)" : ui.facts.backend.c_str());
  ImGui::Text("KV dtype  %s, %s per position", ui.facts.kv_dtype.c_str(),
              format_bytes(ui.facts.kv_bytes_per_token).c_str());
  std::string state = cs.loading   ? "opening..."
                      : cs.busy    ? "computing"
                      : cs.playing ? "playing"
                                   : "paused";
  if (cs.finished && !v.finish_text.empty()) state = v.finish_text;
  ImGui::Text("state     %s", state.c_str());
  ImGui::Text("frame     %.1f ms", 1000.0f / std::max(io.Framerate, 1.0f));
}

}  // namespace kvscope::app
