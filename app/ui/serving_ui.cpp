// serving_ui.cpp — see serving_ui.h.
//
// Layout (the single view's regions, compute_layout): the toolbar switches views and runs
// the workload; the left column holds the workload and the scheduler's settings; the right
// column the pool's numbers, the sequences and the plots; the strip under the view the
// step's batch against its token budget, the waiting queue and the step's events; the
// bottom strip the legend of the tiles. Every number is the snapshot's, which is the
// scheduler's own.
#include "app/ui/serving_ui.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/ui/app_frame.h"
#include "app/ui/plot_draw.h"
#include "app/ui/ui_region.h"
#include "app/ui/ui_state.h"
#if KVSCOPE_WITH_SERVE
#include "app/serve/serve_watch.h"
#endif

namespace kvscope::app {
namespace {

// Linear RGB (the scene's colours) to the sRGB-ish bytes ImGui draws, so a lane's chip in a
// panel looks like its tokens in the view.
ImU32 to_im(glm::vec3 c, float alpha = 1.0f) {
  auto ch = [](float v) { return int(std::clamp(v, 0.0f, 1.0f) * 255.0f + 0.5f); };
  return IM_COL32(ch(c.r), ch(c.g), ch(c.b), int(std::clamp(alpha, 0.0f, 1.0f) * 255.0f));
}

// What a lane's sequence is now: its state, or "pruned" for a beam the search dropped.
const char* lane_state_word(const Lane& l) {
  if (l.state == LaneState::Finished && l.stop == "pruned") return "pruned";
  switch (l.state) {
    case LaneState::Waiting: return "waiting";
    case LaneState::Running: return "running";
    case LaneState::Preempted: return "preempted";
    case LaneState::Finished: return "finished";
    case LaneState::Cancelled: return "cancelled";
    case LaneState::Failed: return "failed";
  }
  return "?";
}

const char* flash_word(TileFlash f) {
  switch (f) {
    case TileFlash::None: return "";
    case TileFlash::Written: return "written this step";
    case TileFlash::PrefixHit: return "adopted from the prefix cache this step (no compute)";
    case TileFlash::Cow: return "copied on write this step";
    case TileFlash::Evicted: return "evicted from the prefix cache and reused this step";
    case TileFlash::Released: return "given back to the pool this step";
  }
  return "";
}

const char* event_word(EventKind k) {
  switch (k) {
    case EventKind::Arrive: return "arrives";
    case EventKind::Admit: return "admitted";
    case EventKind::PrefixHit: return "prefix hit";
    case EventKind::Chunk: return "prompt chunk";
    case EventKind::Cow: return "copy-on-write";
    case EventKind::Preempt: return "PREEMPTED";
    case EventKind::Finish: return "finished";
    case EventKind::Cancel: return "cancelled";
    case EventKind::Fail: return "failed";
    case EventKind::Fork: return "forked";
    case EventKind::Rollback: return "rolled back";
  }
  return "?";
}

// A small square in a sequence's colour, inline with the text after it.
void swatch(int palette, float alpha = 1.0f) {
  const float h = ImGui::GetTextLineHeight();
  ImVec2 p = ImGui::GetCursorScreenPos();
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + h - 4, p.y + h - 2),
                                            serving_im_color(palette, alpha), 2.0f);
  ImGui::Dummy(ImVec2(h - 2, h));
  ImGui::SameLine(0, 4);
}

std::string lane_name(const Lane& l, int n) {
  char b[64];
  if (n > 1)
    std::snprintf(b, sizeof b, "#%d (request %d, sample %d)", l.seq, l.request, l.sample);
  else
    std::snprintf(b, sizeof b, "#%d (request %d)", l.seq, l.request);
  return b;
}

// The newest words of a lane, for tooltips.
std::string lane_tail(const Lane& l, size_t max_chars = 80) {
  std::string t;
  for (size_t i = size_t(l.prompt_tokens); i < l.pieces.size(); ++i) t += l.pieces[i];
  if (t.empty()) {
    for (const auto& p : l.pieces) t += p;
  }
  if (t.size() > max_chars) {
    size_t cut = t.size() - max_chars;
    while (cut < t.size() && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) ++cut;
    t = "..." + t.substr(cut);
  }
  return t;
}

void toolbar(UiState& ui, ServingUi& s) {
  const float h = ImGui::GetFrameHeight();
  if (ImGui::Button("Single sequence", ImVec2(0, h))) ui.serving = false;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Back to one sequence, its cache and its attention");
  ImGui::SameLine();
  ImGui::PushStyleColor(ImGuiCol_Button, ImGui::GetStyle().Colors[ImGuiCol_ButtonActive]);
  ImGui::Button("Serving", ImVec2(0, h));
  ImGui::PopStyleColor();
  ImGui::SameLine(0, 24);
  if (s.server) {
    ImGui::TextColored(ImVec4(0.5f, 0.95f, 0.6f, 1), "SERVING HTTP");
    ImGui::SameLine(0, 24);
  }
  ImGui::BeginDisabled(s.server != nullptr);
  const bool keys = !ImGui::GetIO().WantTextInput && !s.server;
  if (ImGui::Button(s.started ? "Restart" : "Start", ImVec2(0, h)) ||
      (keys && ImGui::IsKeyPressed('R', false))) {
    if (s.replay) {
      s.snap = serving_replay_at(s, 0, nullptr);
      s.playing = true;
    } else {
      serving_start(ui, s, true);
    }
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(s.replay ? "Play the recording from its first step (R)"
                               : "Serve the workload from the start with the settings on the "
                                 "left (R)");
  ImGui::SameLine();
  const bool space = keys && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false);
  if (s.playing) {
    if (ImGui::Button("Pause", ImVec2(64, h)) || space) {
      if (s.run && !s.replay) s.run->pause();
      s.playing = false;
    }
  } else if (ImGui::Button("Play", ImVec2(64, h)) || space) {
    if (s.replay) {
      s.playing = true;
    } else if (!s.started) {
      serving_start(ui, s, true);
    } else if (s.run) {
      s.run->play();
      s.playing = true;
    }
  }
  ImGui::SameLine();
  if (ImGui::Button("Step", ImVec2(0, h)) ||
      (keys && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow)))) {
    s.playing = false;
    if (s.replay) {
      if (auto n = serving_replay_at(s, s.replay_index + 1, nullptr)) s.snap = std::move(n);
    } else {
      if (!s.started) serving_start(ui, s, false);
      if (s.run) {
        s.run->pause();
        s.run->step();
      }
    }
  }
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("One scheduler step: one forward pass (Right arrow)");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(150);
  if (ImGui::SliderFloat("##speed", &s.settings.speed, 0.0f, 20.0f,
                         s.settings.speed <= 0 ? "max steps/s" : "%.1f steps/s") &&
      s.run)
    s.run->set_speed(s.settings.speed);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Steps per second (0: as fast as the engine goes)");
  ImGui::EndDisabled();
  ImGui::SameLine(0, 24);
  const ServingSnapshot* snap = s.snap.get();
  if (s.replay) {
    ImGui::TextColored(ImVec4(0.95f, 0.8f, 0.45f, 1), "REPLAY");
    ImGui::SameLine();
    if (ImGui::SmallButton("close")) {
      s.replay.reset();
      s.snap.reset();
      s.started = false;
      s.playing = false;
      return;
    }
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Close the recording (back to the model)");
    ImGui::SameLine();
  }
  if (!snap || !s.started) {
    ImGui::TextDisabled("Press Start to serve %d requests from one pool of KV blocks",
                        s.settings.requests + int(s.settings.typed_prompts.size()));
  } else if (!snap->error.empty()) {
    ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", snap->error.c_str());
  } else {
    const ServingPoint* p = snap->history.empty() ? nullptr : &snap->history.back();
    ImGui::Text("step %d  |  %d running  %d waiting  %d finished of %d%s", snap->step,
                p ? p->running : 0, p ? p->waiting : 0, p ? p->finished : 0,
                int(snap->lanes.size()), snap->done ? "  |  all done" : "");
  }
}

void workload_section(UiState& ui, ServingUi& s) {
  ServingSettings& w = s.settings;
  ImGui::TextWrapped(
      "Requests made from the prompts in prompts/, in turn, each served as its own sequence.");
  ImGui::SliderInt("requests", &w.requests, 0, 32);
  ImGui::Checkbox("shared system prompt", &w.use_prefix);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("The same text before every prompt: its full blocks are computed once "
                      "and then found in the prefix cache");
  if (w.prefix.empty()) w.prefix = kDefaultServingPrefix;
  if (w.use_prefix) {
    char buf[1024];
    std::snprintf(buf, sizeof buf, "%s", w.prefix.c_str());
    if (ImGui::InputTextMultiline("##prefix", buf, sizeof buf, ImVec2(-1, 60))) w.prefix = buf;
  }
  char typed[512];
  std::snprintf(typed, sizeof typed, "%s", w.typed.c_str());
  ImGui::SetNextItemWidth(-70);
  if (ImGui::InputTextWithHint("##typed", "type a prompt", typed, sizeof typed)) w.typed = typed;
  ImGui::SameLine();
  if (ImGui::Button("Add") && !w.typed.empty()) {
    w.typed_prompts.push_back(w.typed);
    w.typed.clear();
  }
  if (!w.typed_prompts.empty()) {
    ImGui::TextDisabled("%d typed prompt(s) join the next Start", int(w.typed_prompts.size()));
    ImGui::SameLine();
    if (ImGui::SmallButton("clear")) w.typed_prompts.clear();
  }
  const char* kinds[] = {"all at once", "every N steps", "Poisson"};
  ImGui::Combo("arrival", &w.arrival_kind, kinds, 3);
  if (w.arrival_kind == 1) ImGui::SliderInt("N steps", &w.every, 1, 16);
  if (w.arrival_kind == 2) ImGui::SliderFloat("per step", &w.rate, 0.05f, 4.0f, "%.2f");
  ImGui::SliderInt("seed", &w.seed, 0, 1000);
  ImGui::SliderInt("max tokens", &w.max_tokens, 1, 200);
  ImGui::SliderInt("samples n", &w.n, 1, 8);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Parallel sampling: n sequences fork one prompt's blocks and share them "
                      "until each writes its own");
  ImGui::SliderInt("beams", &w.beams, 0, 8, w.beams == 0 ? "off" : "%d");
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Beam search: the K most likely continuations live on as lanes that fork "
                      "the blocks they share; a pruned beam fades and its own blocks go back "
                      "to the pool. Samples and temperature do not apply");
  if (w.beams > 0) ImGui::SliderFloat("length penalty", &w.length_penalty, 0.0f, 2.0f, "%.2f");
  ImGui::SliderFloat("temperature", &w.temperature, 0.0f, 1.5f, "%.2f");
  (void)ui;
}

void scheduler_section(ServingUi& s) {
  ServingSettings& w = s.settings;
  ImGui::SliderInt("max seqs", &w.max_seqs, 1, 32);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Sequences running at once (--max-seqs)");
  ImGui::SliderInt("token budget", &w.max_batch_tokens, 16, 512);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Tokens through one forward pass: decode tokens plus prompt chunks");
  int bi = w.block == 8 ? 0 : w.block == 32 ? 2 : 1;
  const char* blocks[] = {"8", "16", "32"};
  if (ImGui::Combo("block size", &bi, blocks, 3)) w.block = bi == 0 ? 8 : bi == 2 ? 32 : 16;
  ImGui::SliderInt("pool blocks", &w.pool_blocks, 4, 512);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Blocks in the pool. Too few for the running sequences and the newest "
                      "is preempted: its blocks go back, and it is computed again later");
  ImGui::SliderInt("context", &w.context, 64, 2048);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Positions one sequence may hold (what a contiguous cache would reserve)");
  ImGui::Checkbox("prefix caching", &w.prefix_caching);
  const char* spec[] = {"off", "n-gram lookup", "early exit", "draft model"};
  ImGui::Combo("speculative", &w.speculative, spec, 4);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Each running sequence drafts tokens and the model checks them in the "
                      "same forward pass; rejected drafts are rolled back out of the pool");
  if (w.speculative == 2) ImGui::SliderInt("exit layers", &w.exit_layers, 1, 29);
  if (w.speculative == 3) {
    char path[1024];
    std::snprintf(path, sizeof path, "%s", w.draft_path.c_str());
    if (ImGui::InputTextWithHint("draft", "path to a GGUF with this model's vocabulary", path,
                                 sizeof path))
      w.draft_path = path;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("A smaller model drafts for every sequence, in a cache of its own; "
                        "the served model verifies its tokens (--speculative draft:PATH)");
  }
  if (w.speculative > 0) ImGui::SliderInt("draft max", &w.draft_max, 1, 15);
  ImGui::TextDisabled("Settings apply at the next Start.");
}

void selected_section(ServingUi& s) {
  const ServingSnapshot* snap = s.snap.get();
  const Lane* l = snap ? snap->lane(s.selected_seq) : nullptr;
  if (!l) {
    ImGui::TextWrapped("Click a lane (or a row of Sequences) to draw its block table and its "
                       "attention.");
    return;
  }
  swatch(l->color);
  ImGui::TextUnformatted(lane_name(*l, 2).c_str());
  ImGui::Text("%s, %d positions in %d blocks", lane_state_word(*l), l->computed,
              int(l->table.size()));
  ImGui::Text("prompt %d (%d from the prefix cache)", l->prompt_tokens, l->cached_tokens);
  ImGui::Text("generated %d", std::max(0, int(l->ids.size()) - l->prompt_tokens));
  std::string table = "table:";
  for (size_t i = 0; i < l->table.size() && i < 24; ++i) {
    char b[16];
    std::snprintf(b, sizeof b, " %d", int(l->table[i]));
    table += b;
  }
  if (l->table.size() > 24) table += " ...";
  ImGui::TextWrapped("%s", table.c_str());
  ImGui::TextWrapped("%s", lane_tail(*l, 240).c_str());
  if (ImGui::SmallButton("unselect")) s.selected_seq = -1;
}

void serve_section(UiState& ui, ServingUi& s) {
  if (!serving_can_serve()) {
    ImGui::TextWrapped("This build has no HTTP endpoint (cpp-httplib was not found).");
    return;
  }
  ImGui::TextWrapped(
      "An OpenAI-compatible endpoint on this model: point a client at it and watch its "
      "requests join the batch and take blocks from the pool.");
  if (!s.server) {
    ImGui::SetNextItemWidth(90);
    ImGui::InputInt("port", &s.serve_port, 0);
    s.serve_port = std::clamp(s.serve_port, 0, 65535);
    ImGui::SameLine();
    if (ImGui::Button("Serve")) serving_serve_start(ui, s);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("Listen on 127.0.0.1 (this machine only), with the Scheduler settings");
    if (!s.serve_error.empty())
      ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", s.serve_error.c_str());
    return;
  }
#if KVSCOPE_WITH_SERVE
  const serve::EngineSnapshot e = s.server->engine_state();
  ImGui::TextColored(ImVec4(0.5f, 0.95f, 0.6f, 1), "listening on http://%s:%d",
                     s.server->host().c_str(), s.server->port());
  ImGui::Text("model \"%s\"; %d in flight, %llu served", s.server->model_id().c_str(),
              e.in_flight, static_cast<unsigned long long>(e.requests));
  char cmd[256];
  std::snprintf(cmd, sizeof cmd,
                "curl -sN localhost:%d/v1/completions -H 'Content-Type: application/json' -d "
                "'{\"prompt\": \"Once upon a time\", \"max_tokens\": 48, \"stream\": true}'",
                s.server->port());
  ImGui::InputText("##curl", cmd, sizeof cmd, ImGuiInputTextFlags_ReadOnly);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("A request to try (select and copy)");
#endif
  if (ImGui::Button("Stop serving")) serving_serve_stop(s);
}

void pool_numbers(const ServingSnapshot& snap) {
  const ServingPoint* p = snap.history.empty() ? nullptr : &snap.history.back();
  int shared = 0;
  for (const PoolTile& t : snap.tiles) shared += t.refs > 1;
  ImGui::TextWrapped("blocks: %d used (%d shared), %d cached, %d free of %d", p ? p->used : 0, shared,
              p ? p->cached : 0, p ? p->free : snap.n_blocks, snap.n_blocks);
  ImGui::Text("block: %d positions; context %d", snap.block_size, snap.context);
  if (!p) return;
  ImGui::TextWrapped("slots used: %.0f%%  (contiguous: %.0f%%)", 100 * p->slot_utilization,
              100 * p->contiguous_utilization);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Positions held / slots allocated, now. A contiguous cache reserves the "
                      "whole context for every running sequence");
  ImGui::Text("fragmentation: %.1f%%   prefix hits: %.0f%%", 100 * p->fragmentation,
              100 * p->prefix_hit_rate);
  ImGui::TextWrapped("this step: %d prefill + %d decode tokens, %.1f ms", p->prefill_tokens,
              p->decode_tokens, p->ms);
  ImGui::Text("%.0f tokens/s through the forward", p->tokens_per_s);
  long drafted = 0, accepted = 0;
  for (const ServingPoint& h : snap.history) {
    drafted += h.drafted;
    accepted += h.accepted;
  }
  if (drafted > 0)
    ImGui::TextWrapped("speculative: %.0f%% of %ld drafted tokens accepted (this step %d of %d)",
                       100.0 * double(accepted) / double(drafted), drafted, p->accepted,
                       p->drafted);
  const SchedulerStats& t = snap.totals;
  ImGui::Text("preemptions %d, copies on write %d", t.preemptions, t.cow_copies);
  if (t.ttft_hits + t.ttft_misses > 0)
    ImGui::TextWrapped("first token: %.0f ms with a prefix hit, %.0f ms without", t.ttft_hit_ms,
                t.ttft_miss_ms);
}

void sequences_table(ServingUi& s) {
  const ServingSnapshot* snap = s.snap.get();
  if (!snap || snap->lanes.empty()) {
    ImGui::TextDisabled("No sequences yet.");
    return;
  }
  const ImGuiTableFlags f = ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit |
                            ImGuiTableFlags_ScrollY | ImGuiTableFlags_BordersInnerV;
  const float h = std::min(ImGui::GetTextLineHeightWithSpacing() * float(snap->lanes.size() + 1.5),
                           ImGui::GetTextLineHeightWithSpacing() * 9.5f);
  s.hovered_seq_panel = -1;
  if (!ImGui::BeginTable("##seqs", 6, f, ImVec2(0, h))) return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("seq");
  ImGui::TableSetupColumn("state");
  ImGui::TableSetupColumn("prompt");
  ImGui::TableSetupColumn("gen");
  ImGui::TableSetupColumn("TTFT");
  ImGui::TableSetupColumn("tok/s");
  ImGui::TableHeadersRow();
  for (const Lane& l : snap->lanes) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    swatch(l.color, l.state == LaneState::Running ? 1.0f : 0.5f);
    char id[16];
    std::snprintf(id, sizeof id, "%d", l.seq);
    if (ImGui::Selectable(id, s.selected_seq == l.seq, ImGuiSelectableFlags_SpanAllColumns))
      s.selected_seq = s.selected_seq == l.seq ? -1 : l.seq;
    if (ImGui::IsItemHovered()) s.hovered_seq_panel = l.seq;
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(lane_state_word(l));
    ImGui::TableNextColumn();
    if (l.cached_tokens > 0)
      ImGui::Text("%d (%d hit)", l.prompt_tokens, l.cached_tokens);
    else
      ImGui::Text("%d", l.prompt_tokens);
    ImGui::TableNextColumn();
    ImGui::Text("%d", std::max(0, int(l.ids.size()) - l.prompt_tokens));
    ImGui::TableNextColumn();
    if (l.ttft_ms >= 0)
      ImGui::Text("%.0f ms", l.ttft_ms);
    else
      ImGui::TextDisabled("-");
    ImGui::TableNextColumn();
    if (l.tokens_per_s > 0)
      ImGui::Text("%.1f", l.tokens_per_s);
    else
      ImGui::TextDisabled("-");
  }
  ImGui::EndTable();
}

void plots(const ServingSnapshot& snap) {
  if (snap.history.size() < 2) {
    ImGui::TextDisabled("Plots start after two steps.");
    return;
  }
  std::vector<double> x, used, cached, freeb, running, waiting, finished, tps, util, contig,
      prefill, decode, hits, frag;
  for (const ServingPoint& p : snap.history) {
    finished.push_back(p.finished);
    prefill.push_back(p.prefill_tokens);
    decode.push_back(p.decode_tokens);
    hits.push_back(100 * p.prefix_hit_rate);
    frag.push_back(100 * p.fragmentation);
    x.push_back(p.step);
    used.push_back(p.used);
    cached.push_back(p.cached);
    freeb.push_back(p.free);
    running.push_back(p.running);
    waiting.push_back(p.waiting);
    tps.push_back(p.tokens_per_s);
    util.push_back(100 * p.slot_utilization);
    contig.push_back(100 * p.contiguous_utilization);
  }
  const ImU32 kUsed = IM_COL32(120, 200, 255, 255), kCached = IM_COL32(200, 170, 90, 255),
              kFree = IM_COL32(150, 150, 160, 255), kRun = IM_COL32(120, 230, 150, 255),
              kWait = IM_COL32(255, 170, 80, 255);
  ImGui::TextDisabled("blocks: used, cached, free");
  PlotSpec a;
  a.id = "##blocks";
  a.height = 70;
  a.x_label = "step";
  draw_plot(a, {{&x, &used, kUsed, nullptr, 2, false, "used"},
                {&x, &cached, kCached, nullptr, 1.5f, false, "cached"},
                {&x, &freeb, kFree, nullptr, 1.5f, false, "free"}});
  ImGui::TextDisabled("sequences: running, waiting, finished");
  PlotSpec b = a;
  b.id = "##seqs_plot";
  b.height = 60;
  draw_plot(b, {{&x, &running, kRun, nullptr, 2, false, "running"},
                {&x, &waiting, kWait, nullptr, 1.5f, false, "waiting"},
                {&x, &finished, kFree, nullptr, 1.5f, false, "finished"}});
  ImGui::TextDisabled("tokens this step: prompt, decode");
  PlotSpec e = a;
  e.id = "##step_tokens";
  e.height = 60;
  draw_plot(e, {{&x, &prefill, kCached, nullptr, 1.5f, false, "prompt"},
                {&x, &decode, kRun, nullptr, 2, false, "decode"}});
  ImGui::TextDisabled("prefix hits %%, fragmentation %%");
  PlotSpec h = a;
  h.id = "##hits";
  h.height = 60;
  h.y_suffix = "%";
  draw_plot(h, {{&x, &hits, kUsed, nullptr, 2, false, "prefix hits"},
                {&x, &frag, kWait, nullptr, 1.5f, false, "fragmentation"}});
  ImGui::TextDisabled("slots used %%: paged, contiguous");
  PlotSpec c = a;
  c.id = "##util";
  c.height = 60;
  c.y_suffix = "%";
  draw_plot(c, {{&x, &util, kUsed, nullptr, 2, false, "paged"},
                {&x, &contig, kWait, nullptr, 1.5f, false, "contiguous"}});
  ImGui::TextDisabled("tokens/s through the forward");
  PlotSpec d = a;
  d.id = "##tps";
  d.height = 60;
  draw_plot(d, {{&x, &tps, kRun, nullptr, 2, false, "tokens/s"}});
}

// The step's batch as a bar of its token budget: one segment per sequence that ran, decode
// tokens (solid) and prompt chunks (striped, with their token count); then the queue.
void batch_strip(ServingUi& s) {
  const ServingSnapshot* snap = s.snap.get();
  if (!snap || snap->step == 0) {
    ImGui::TextWrapped(
        "Each step is ONE forward pass over the tokens of many sequences: a decode token for "
        "each running sequence and chunks of new prompts, up to the token budget. The pool "
        "below the lanes holds every sequence's K and V in fixed-size blocks (pages).");
    return;
  }
  int decode = 0, prefill = 0;
  for (const Lane& l : snap->lanes)
    if (l.step_tokens > 0) (l.step_prompt ? prefill : decode) += l.step_tokens;
  ImGui::Text("step %d batch: %d decode + %d prompt tokens of a %d-token budget", snap->step,
              decode, prefill, snap->max_batch_tokens);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float w = ImGui::GetContentRegionAvail().x, h = 18.0f;
  dl->AddRectFilled(p0, ImVec2(p0.x + w, p0.y + h), IM_COL32(40, 42, 50, 255), 3);
  const float per = w / float(std::max(1, snap->max_batch_tokens));
  float x = p0.x;
  for (int pass = 0; pass < 2; ++pass)
    for (const Lane& l : snap->lanes) {
      if (l.step_tokens <= 0 || l.step_prompt != (pass == 1)) continue;
      const float x1 = std::min(x + per * float(l.step_tokens), p0.x + w);
      dl->AddRectFilled(ImVec2(x, p0.y), ImVec2(x1, p0.y + h), serving_im_color(l.color));
      if (l.step_prompt) {
        for (float sx = x - h; sx < x1; sx += 6)
          dl->AddLine(ImVec2(std::max(sx, x), p0.y + (std::max(sx, x) - sx)),
                      ImVec2(std::min(sx + h, x1), p0.y + (std::min(sx + h, x1) - sx)),
                      IM_COL32(0, 0, 0, 90), 1.0f);
        char t[16];
        std::snprintf(t, sizeof t, "%d", l.step_tokens);
        if (ImGui::CalcTextSize(t).x + 4 < x1 - x)
          dl->AddText(ImVec2(x + 3, p0.y + 1), IM_COL32(0, 0, 0, 255), t);
      }
      dl->AddLine(ImVec2(x1, p0.y), ImVec2(x1, p0.y + h), IM_COL32(10, 10, 14, 255));
      x = x1;
    }
  ImGui::Dummy(ImVec2(w, h));
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Solid: decode tokens (one per running sequence); striped: prompt chunks. "
                      "Width: share of the token budget.");
  // The queue, head first.
  ImGui::TextUnformatted("waiting:");
  if (snap->waiting.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("none");
  }
  for (size_t i = 0; i < snap->waiting.size() && i < 20; ++i) {
    const Lane* l = snap->lane(snap->waiting[i]);
    if (!l) continue;
    ImGui::SameLine();
    swatch(l->color, 0.6f);
    ImGui::Text("#%d%s", l->seq, l->state == LaneState::Preempted ? " (preempted)" : "");
  }
  // The step's events, in the order the scheduler made them.
  std::string ev;
  int shown = 0;
  for (const SchedEvent& e : snap->events) {
    if (e.kind == EventKind::Chunk || e.kind == EventKind::Arrive) continue;
    if (shown++ > 8) {
      ev += "  ...";
      break;
    }
    char b[96];
    if (e.kind == EventKind::PrefixHit)
      std::snprintf(b, sizeof b, "#%d prefix hit (%d tokens)", e.seq, e.n);
    else if (e.kind == EventKind::Cow)
      std::snprintf(b, sizeof b, "#%d copy-on-write", e.seq);
    else if (e.kind == EventKind::Preempt)
      std::snprintf(b, sizeof b, "#%d PREEMPTED (%d to recompute)", e.seq, e.n);
    else if (e.kind == EventKind::Fork)
      std::snprintf(b, sizeof b, "#%d forked from #%d", e.seq, e.n);
    else if (e.kind == EventKind::Rollback)
      std::snprintf(b, sizeof b, "#%d rolled back %d draft rows", e.seq, e.n);
    else if (e.kind == EventKind::Finish && e.detail == "pruned")
      std::snprintf(b, sizeof b, "#%d pruned", e.seq);
    else
      std::snprintf(b, sizeof b, "#%d %s", e.seq, event_word(e.kind));
    ev += (ev.empty() ? "" : ",  ") + std::string(b);
  }
  ImGui::TextWrapped("events: %s", ev.empty() ? "none" : ev.c_str());
}

void legend_tile(ImU32 fill, const char* text, bool striped = false, bool dim = false) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float h = ImGui::GetTextLineHeight();
  ImVec2 p = ImGui::GetCursorScreenPos();
  ImVec2 q(p.x + h * 1.3f, p.y + h);
  dl->AddRectFilled(p, q, fill, 2);
  if (striped)
    for (float sx = p.x - h; sx < q.x; sx += 4)
      dl->AddLine(ImVec2(std::max(sx, p.x), p.y + std::max(sx, p.x) - sx),
                  ImVec2(std::min(sx + h, q.x), p.y + std::min(sx + h, q.x) - sx),
                  IM_COL32(255, 255, 255, 150));
  if (dim) dl->AddRectFilled(p, q, IM_COL32(0, 0, 0, 120), 2);
  ImGui::Dummy(ImVec2(h * 1.3f, h));
  ImGui::SameLine(0, 4);
  ImGui::TextUnformatted(text);
  ImGui::SameLine(0, 18);
}

// Whether the run searches beams: a fork that is no sample (serving_fork_stem).
bool has_beams(const ServingSnapshot* s) {
  if (!s) return false;
  for (const Lane& l : s->lanes)
    if (l.parent >= 0 && l.sample == 0) return true;
  return false;
}

void legend(const ServingSnapshot* snap) {
  ImGui::TextDisabled("the pool:");
  ImGui::SameLine();
  legend_tile(serving_im_color(0), "a block held by one sequence (its colour)");
  legend_tile(serving_im_color(1), "shared (xN: references)", true);
  legend_tile(serving_im_color(2), "cached, unreferenced", false, true);
  legend_tile(to_im(serving_free_color()), "free");
  ImGui::NewLine();
  ImGui::TextDisabled("lanes:");
  ImGui::SameLine();
  ImGui::TextUnformatted(
      has_beams(snap)
          ? "one row per beam; a bar marks where it branched off its parent, whose tokens (faint) "
            "and blocks it shares; faded rows were pruned and their own blocks freed. Click a row."
          : "one row per sequence; ticks mark its blocks; bright tokens were computed, outlined "
            "ones came from the prefix cache. Hover a tile or a lane; click a lane for its block "
            "table.");
}

}  // namespace

unsigned serving_im_color(int palette, float alpha) {
  return to_im(serving_color(palette), alpha);
}

std::string arrival_spec(const ServingSettings& s) {
  char b[48];
  if (s.arrival_kind == 0) return "all";
  if (s.arrival_kind == 2) {
    std::snprintf(b, sizeof b, "poisson:%g", double(s.rate));
    return b;
  }
  std::snprintf(b, sizeof b, "every:%d", std::max(1, s.every));
  return b;
}

ServingConfig serving_config(const ServingSettings& s, const std::vector<PromptSpec>& prompts) {
  ServingConfig c;
  SchedulerConfig& k = c.scheduler;
  k.block_size = s.block;
  k.pool_blocks = s.pool_blocks;
  k.context = s.context;
  k.max_batch_tokens = s.max_batch_tokens;
  k.max_seqs = s.max_seqs;
  k.prefix_caching = s.prefix_caching;
  k.attention = true;
  if (s.speculative > 0) {
    k.speculation.kind = s.speculative == 1   ? DraftKind::Ngram
                         : s.speculative == 2 ? DraftKind::EarlyExit
                                              : DraftKind::Model;
    k.speculation.layers = s.exit_layers;
    k.speculation.draft_path = s.draft_path;
    k.speculation.draft_max = s.draft_max;
  }
  ServingWorkload& w = c.workload;
  for (int i = 0; i < s.requests && !prompts.empty(); ++i) {
    w.prompts.push_back(prompts[size_t(i) % prompts.size()]);  // a chat prompt as a chat turn
  }
  for (const std::string& t : s.typed_prompts) {
    PromptSpec p;
    p.text = t;
    w.prompts.push_back(p);
  }
  w.shared_prefix = s.use_prefix ? (s.prefix.empty() ? kDefaultServingPrefix : s.prefix) : "";
  w.arrival = arrival_spec(s);
  w.seed = uint64_t(s.seed);
  w.max_tokens = s.max_tokens;
  w.n = s.beams > 0 ? 1 : s.n;
  w.beams = s.beams;
  w.length_penalty = s.length_penalty;
  w.sampler.temperature = s.temperature;
  w.sampler.seed = uint64_t(s.seed);
  c.record_path = s.record_path;
  return c;
}

void serving_start(UiState& ui, ServingUi& s, bool play) {
  if (!s.run) s.run = std::make_unique<ServingRun>(ui.engine_options);
  std::vector<PromptSpec> prompts;
  for (const PromptChoice& p : ui.prompts) prompts.push_back(p.spec);
  s.run->set_speed(s.settings.speed);
  s.run->start(serving_config(s.settings, prompts), play);
  s.started = true;
  s.playing = play;
  s.selected_seq = -1;
}

bool serving_can_serve() {
#if KVSCOPE_WITH_SERVE
  return true;
#else
  return false;
#endif
}

bool serving_serve_start(UiState& ui, ServingUi& s) {
  s.serve_error.clear();
#if KVSCOPE_WITH_SERVE
  if (s.run) s.run->pause();
  s.playing = false;
  std::vector<PromptSpec> prompts;
  const ServingConfig cfg = serving_config(s.settings, prompts);
  serve::ServeServerConfig sc;
  sc.port = s.serve_port;
  auto w = serve::WatchedServer::start(ui.engine_options, cfg.scheduler, sc);
  if (!w.ok()) {
    s.serve_error = w.error().message;
    return false;
  }
  s.server = std::move(w).value();
  s.started = true;
  s.selected_seq = -1;
  add_notice(ui, "Serving on http://127.0.0.1:" + std::to_string(s.server->port()) +
                     ": requests from clients appear here as they run.");
  return true;
#else
  (void)ui;
  s.serve_error = "this build has no HTTP endpoint";
  return false;
#endif
}

void serving_serve_stop(ServingUi& s) {
  s.server.reset();
  s.snap.reset();
  s.selected_seq = -1;
  if (s.run) serving_sync(s, 0.0);
}

Status serving_open_replay(ServingUi& s, const std::string& path) {
  auto r = ServingReplay::open(path);
  if (!r.ok()) return r.error();
  if (s.run) s.run->pause();
  s.replay = std::move(r).value();
  s.replay_index = 0;
  s.replay_advanced = -1;
  s.started = true;
  s.playing = false;
  s.selected_seq = -1;
  std::string err;
  s.snap = serving_replay_at(s, 0, &err);
  return err.empty() ? Status::Ok() : make_error(err);
}

std::shared_ptr<const ServingSnapshot> serving_replay_at(ServingUi& s, int index,
                                                         std::string* error) {
  if (!s.replay || s.replay->steps() == 0) return nullptr;
  index = std::clamp(index, 0, s.replay->steps() - 1);
  auto snap = s.replay->snapshot(index);
  if (!snap.ok()) {
    if (error) *error = snap.error().message;
    return nullptr;
  }
  s.replay_index = index;
  return *snap;
}

void serving_sync(ServingUi& s, double now) {
  std::shared_ptr<const ServingSnapshot> snap;
  if (s.replay) {
    const int last = s.replay->steps() - 1;
    if (s.playing && s.replay_index < last) {
      const double dt = s.settings.speed > 0 ? 1.0 / s.settings.speed : 0.0;
      if (s.replay_advanced < 0) s.replay_advanced = now;
      if (now - s.replay_advanced >= dt) {
        s.replay_advanced = now;
        std::string err;
        if (auto n = serving_replay_at(s, s.replay_index + 1, &err)) s.snap = std::move(n);
      }
    }
    if (s.replay_index >= last) s.playing = false;
    if (s.snap && s.snap->step != s.last_step) {
      s.last_step_time = now;
      s.last_step = s.snap->step;
    }
    return;
  }
#if KVSCOPE_WITH_SERVE
  if (s.server) {
    snap = s.server->snapshot();
    if (snap && (!s.snap || snap->run != s.snap->run || snap->step != s.snap->step)) {
      s.last_step_time = now;
      s.last_step = snap->step;
    }
    s.snap = std::move(snap);
    s.playing = true;
    return;
  }
#endif
  if (!s.run) return;
  snap = s.run->snapshot();
  if (snap && (!s.snap || snap->run != s.snap->run || snap->step != s.snap->step)) {
    s.last_step_time = now;
    s.last_step = snap->step;
  }
  s.snap = std::move(snap);
  if (s.snap && (s.snap->done || !s.snap->error.empty())) s.playing = false;
}

void draw_serving_ui(UiState& ui, ServingUi& s) {
  ImGuiIO& io = ImGui::GetIO();
  ui.layout = compute_layout(io.DisplaySize.x, io.DisplaySize.y, ui.layout_prefs, ui_scale());
  const UiLayout& L = ui.layout;
  ui.shown.clear();
  ImGui::PushStyleVar(ImGuiStyleVar_WindowRounding, 0.0f);
  ImGui::PushStyleVar(ImGuiStyleVar_WindowBorderSize, 1.0f);
  if (!L.toolbar.empty()) {
    ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding,
                        ImVec2(8.0f, (L.toolbar.h - ImGui::GetFrameHeight()) * 0.5f));
    begin_region("##serving_toolbar", L.toolbar, ImGuiWindowFlags_NoScrollbar);
    ImGui::PopStyleVar();
    toolbar(ui, s);
    ImGui::End();
  }
  begin_region("##serving_left", L.left);
  if (L.left_open) {
    ImGui::TextDisabled("serving: many sequences, one pool");
    ImGui::Separator();
    ImGui::PushItemWidth(-110);
    if (ImGui::CollapsingHeader("Workload", ImGuiTreeNodeFlags_DefaultOpen))
      workload_section(ui, s);
    if (ImGui::CollapsingHeader("Scheduler", ImGuiTreeNodeFlags_DefaultOpen)) scheduler_section(s);
    if (ImGui::CollapsingHeader("Serve (HTTP)")) serve_section(ui, s);
    if (ImGui::CollapsingHeader("Selected sequence", ImGuiTreeNodeFlags_DefaultOpen))
      selected_section(s);
    ImGui::PopItemWidth();
  }
  ImGui::End();
  begin_region("##serving_right", L.right);
  if (L.right_open) {
    ImGui::TextDisabled("measured");
    ImGui::Separator();
    if (s.snap) {
      if (ImGui::CollapsingHeader("Pool", ImGuiTreeNodeFlags_DefaultOpen)) pool_numbers(*s.snap);
      if (ImGui::CollapsingHeader("Sequences", ImGuiTreeNodeFlags_DefaultOpen)) sequences_table(s);
      if (ImGui::CollapsingHeader("Plots", ImGuiTreeNodeFlags_DefaultOpen)) plots(*s.snap);
    } else {
      ImGui::TextDisabled("Nothing served yet.");
    }
  }
  ImGui::End();
  if (!L.story.empty()) {
    ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(8.0f, 5.0f));
    begin_region("##serving_story", L.story, ImGuiWindowFlags_NoScrollbar);
    ImGui::PopStyleVar();
    batch_strip(s);
    ImGui::End();
  }
  if (!L.bottom.empty()) {
    begin_region("##serving_bottom", L.bottom, ImGuiWindowFlags_NoScrollbar);
    legend(s.snap.get());
    ImGui::End();
  }
  ImGui::PopStyleVar(2);
  panel_error_modal(ui);
}

ServingFrame serving_frame(UiState& ui, ServingUi& s, double now, float dt) {
  ServingFrame f;
  f.snapshot = s.snap;
  f.view.selected_seq = s.selected_seq;
  f.view.hovered_seq = s.hovered_seq_panel >= 0 ? s.hovered_seq_panel : s.view.picked().seq;
  f.view.hovered_tile = s.view.picked().tile;
  f.clock = AnimClock{now - s.last_step_time, s.playing, now};
  f.rect = ui.layout.view;
  f.dt = dt;
  return f;
}

void serving_overlay(UiState& ui, ServingUi& s, bool clicked) {
  const ServingSnapshot* snap = s.snap.get();
  if (!snap) return;
  ImDrawList* dl = ImGui::GetBackgroundDrawList();
  const UiRect& v = ui.layout.view;
  dl->PushClipRect(ImVec2(v.x, v.y), ImVec2(v.right(), v.bottom()), true);
  const ServingGeometry& g = s.view.geometry();
  // Titles over the two parts of the scene.
  glm::vec2 at;
  // The pool's title under the grid (the lanes sit just above it).
  if (!snap->tiles.empty() &&
      s.view.project(glm::vec3(g.pool_min.x, g.pool_min.y, g.pool_max.z), &at)) {
    char t[128];
    std::snprintf(t, sizeof t,
                  "KV block pool: %d blocks of %d positions, shared by every sequence",
                  snap->n_blocks, snap->block_size);
    dl->AddText(ImVec2(at.x, at.y + 6), IM_COL32(200, 205, 220, 255), t);
  }
  // Lane names at the left end of each lane.
  for (size_t k = 0; k < g.lane_seq.size(); ++k) {
    const Lane* l = snap->lane(g.lane_seq[k]);
    if (!l) continue;
    glm::vec3 p = g.token_center(int(k), 0);
    p.x -= 1.0f;
    if (!s.view.project(p, &at)) continue;
    char t[32];
    std::snprintf(t, sizeof t, "#%d", l->seq);
    const ImVec2 sz = ImGui::CalcTextSize(t);
    dl->AddText(ImVec2(at.x - sz.x, at.y - sz.y * 0.5f),
                l->state == LaneState::Running ? serving_im_color(l->color)
                                               : serving_im_color(l->color, 0.55f),
                t);
  }
  // Reference counts over shared tiles, where a tile is big enough on screen to carry one.
  glm::vec2 a, b;
  const bool sized = !snap->tiles.empty() && s.view.project(g.tile_center(0), &a) &&
                     (snap->tiles.size() < 2 || s.view.project(g.tile_center(1), &b));
  const float tile_px = sized && snap->tiles.size() > 1 ? std::abs(b.x - a.x) : 0.0f;
  if (tile_px >= 14.0f)
    for (size_t i = 0; i < snap->tiles.size(); ++i) {
      const PoolTile& t = snap->tiles[i];
      if (t.refs < 2 || !s.view.project(g.tile_center(int(i)), &at)) continue;
      char c[16];
      std::snprintf(c, sizeof c, "x%d", t.refs);
      const ImVec2 sz = ImGui::CalcTextSize(c);
      dl->AddRectFilled(ImVec2(at.x - sz.x * 0.5f - 2, at.y - sz.y * 0.5f),
                        ImVec2(at.x + sz.x * 0.5f + 2, at.y + sz.y * 0.5f), IM_COL32(0, 0, 0, 170),
                        3);
      dl->AddText(ImVec2(at.x - sz.x * 0.5f, at.y - sz.y * 0.5f), IM_COL32(255, 255, 255, 255), c);
    }
  dl->PopClipRect();

  // What is under the pointer.
  const ServingPick pick = s.view.picked();
  if (pick.tile >= 0 && pick.tile < int(snap->tiles.size())) {
    const PoolTile& t = snap->tiles[size_t(pick.tile)];
    ImGui::BeginTooltip();
    ImGui::Text("block %d: %s", pick.tile,
                t.state == TileState::Free     ? "free"
                : t.state == TileState::Cached ? "cached (no sequence holds it; kept for prefix hits)"
                                               : "in use");
    if (t.refs > 0) ImGui::Text("references: %d", t.refs);
    for (int o : t.owners)
      if (const Lane* l = snap->lane(o)) {
        swatch(l->color);
        ImGui::Text("%s", lane_name(*l, 2).c_str());
      }
    if (t.logical >= 0)
      ImGui::Text("logical block %d: positions %d..%d (%d of %d filled)", t.logical, t.first_pos,
                  t.first_pos + snap->block_size - 1, t.n_pos, snap->block_size);
    if (t.published) ImGui::Text("in the prefix cache; handed out %d times", t.hash_hits);
    if (t.flash != TileFlash::None) ImGui::TextColored(ImVec4(1, 0.9f, 0.5f, 1), "%s", flash_word(t.flash));
    ImGui::EndTooltip();
  } else if (pick.seq >= 0) {
    if (const Lane* l = snap->lane(pick.seq)) {
      ImGui::BeginTooltip();
      swatch(l->color);
      ImGui::Text("%s: %s", lane_name(*l, 2).c_str(), lane_state_word(*l));
      ImGui::Text("%d positions in %d blocks; prompt %d (%d from the prefix cache)", l->computed,
                  int(l->table.size()), l->prompt_tokens, l->cached_tokens);
      if (pick.pos >= 0 && pick.pos < int(l->pieces.size())) {
        const int blk = pick.pos / std::max(1, snap->block_size);
        ImGui::Text("position %d: \"%s\" in logical block %d -> pool block %d", pick.pos,
                    l->pieces[size_t(pick.pos)].c_str(), blk,
                    blk < int(l->table.size()) ? l->table[size_t(blk)] : -1);
      }
      ImGui::TextDisabled("click: its block table and attention");
      ImGui::EndTooltip();
    }
  }
  if (clicked) s.selected_seq = pick.seq >= 0 ? pick.seq : s.selected_seq;
}

}  // namespace kvscope::app
