// panel_controls.cpp — the Controls section: prompt (the prompt files and your own, raw or as
// a chat turn), pace, length, compare modes, sampling, what the beams show. Draws content
// only, into the region the layout gives it (see app_frame.cpp).
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "app/scene/scene_kv.h"
#include "app/ui/ui_state.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

namespace {
// The default colouring's key: a block's K (or V) norm, scaled per layer from the smallest
// to the largest seen so far, on render::palette::kv_color.
void kv_norm_legend(const UiState& ui) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const char *lo = "low", *hi = ui.view.color_by_v ? "high |V|" : "high |K|";
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float h = ImGui::GetTextLineHeight(), pad = ImGui::GetStyle().ItemInnerSpacing.x;
  const float lo_w = ImGui::CalcTextSize(lo).x, hi_w = ImGui::CalcTextSize(hi).x;
  const float w = std::max(ImGui::GetContentRegionAvail().x - 8.0f, 60.0f);
  const float x0 = p0.x + lo_w + pad, x1 = p0.x + w - hi_w - pad;
  constexpr int kSegments = 32;
  for (int i = 0; i < kSegments; ++i) {
    const float a = float(i) / kSegments, b = float(i + 1) / kSegments;
    const glm::vec3 c = render::palette::kv_color(0.5f * (a + b));
    dl->AddRectFilled(ImVec2(x0 + a * (x1 - x0), p0.y + 2.0f),
                      ImVec2(x0 + b * (x1 - x0) + 1.0f, p0.y + h - 2.0f),
                      ImGui::ColorConvertFloat4ToU32(ImVec4(c.r, c.g, c.b, 1.0f)));
  }
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  dl->AddText(p0, text, lo);
  dl->AddText(ImVec2(x1 + pad, p0.y), text, hi);
  ImGui::Dummy(ImVec2(w, h));
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "KV block colour: the L2 norm of the %s row that layer cached for that position,\n"
        "from the layer's smallest norm so far (dark blue) to its largest (pale mint).\n"
        "Dim stacks: NO CACHE keeps nothing. Red flash: recomputed this step.",
        ui.view.color_by_v ? "V" : "K");
}

// The error colouring's scale (scene_kv.h) and what the viewed step measured.
void kv_error_legend(const UiState& ui, const Timeline& tl) {
  // The colour bar, its ticks (0.01%, 0.1%, 1%, 10%) written on it where the scale puts them.
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const float w = std::max(ImGui::GetContentRegionAvail().x - 8.0f, 60.0f),
              h = ImGui::GetTextLineHeight();
  constexpr int kSegments = 48;
  for (int i = 0; i < kSegments; ++i) {
    const float a = float(i) / kSegments, b = float(i + 1) / kSegments;
    const float e = kKvErrorLow * std::pow(kKvErrorHigh / kKvErrorLow, 0.5f * (a + b));
    const glm::vec3 c = kv_error_color(e);
    dl->AddRectFilled(ImVec2(p0.x + a * w, p0.y), ImVec2(p0.x + b * w + 1.0f, p0.y + h),
                      ImGui::ColorConvertFloat4ToU32(ImVec4(c.r, c.g, c.b, 1.0f)));
  }
  const char* labels[] = {"0.01%", "0.1%", "1%", "10%"};
  const float ticks[] = {1e-4f, 1e-3f, 1e-2f, 1e-1f};
  for (int i = 0; i < 4; ++i) {
    const float x = p0.x + kv_error_scale(ticks[i]) * w;
    const float tw = ImGui::CalcTextSize(labels[i]).x;
    // Dark text on the bright end of the scale, light text on the dark end.
    const glm::vec3 under = kv_error_color(ticks[i] * 1.5f);
    const bool bright = 0.3f * under.r + 0.55f * under.g + 0.15f * under.b > 0.45f;
    const ImU32 ink = bright ? IM_COL32(0, 0, 0, 255) : IM_COL32(255, 255, 255, 255);
    dl->AddLine(ImVec2(x, p0.y), ImVec2(x, p0.y + h), bright ? IM_COL32(0, 0, 0, 200) : ink);
    dl->AddText(ImVec2(std::clamp(x + 2.0f, p0.x, p0.x + w - tw), p0.y), ink, labels[i]);
  }
  ImGui::Dummy(ImVec2(w, h));
  // The viewed step's rows: their mean error in the layer shown.
  const StepTrace* t = tl.viewed();
  if (!t || t->k_err.empty() || t->kv_written <= 0) {
    ImGui::TextDisabled("this step: not measured (grey blocks)");
    return;
  }
  const int layer = resolved_layer(ui.view, t->n_layer);
  double k = 0, v = 0;
  for (int i = 0; i < t->kv_written; ++i) {
    k += t->k_err[size_t(layer) * size_t(t->kv_written) + size_t(i)];
    v += t->v_err[size_t(layer) * size_t(t->kv_written) + size_t(i)];
  }
  ImGui::TextDisabled("K %.2g%%  V %.2g%%  (layer %d, step %d)", 100.0 * k / t->kv_written,
                      100.0 * v / t->kv_written, layer, t->step);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Mean error of the rows step %d wrote in layer %d (%s)", t->step, layer,
                      kv_types_name(ui.facts.kv_types).c_str());
}

void send(Controller* ctl, Command c) {
  if (ctl) ctl->send(std::move(c));
}

float text_width(std::string_view s) {
  return ImGui::CalcTextSize(s.data(), s.data() + s.size()).x;
}

// Every edit in the prompt box goes back to the prompt, which is wrapped again for the box
// (prompt_wrap.h); the cursor is kept for the next edit (Backspace or Delete at a break).
int prompt_box_callback(ImGuiInputTextCallbackData* d) {
  UiState& ui = *static_cast<UiState*>(d->UserData);
  if (d->EventFlag == ImGuiInputTextFlags_CallbackEdit) {
    const std::string_view now(d->Buf, size_t(d->BufTextLen));
    const PlainEdit e = unwrap_edit(ui.prompt_shown, ui.prompt_cursor, now, size_t(d->CursorPos));
    ui.custom_prompt = e.text;
    ui.prompt_shown_for = e.text;
    ui.prompt_shown = soft_wrap(e.text, ui.prompt_wrap_width, text_width);
    const std::string& shown = ui.prompt_shown.text;
    if (now != shown) {
      d->DeleteChars(0, d->BufTextLen);
      d->InsertChars(0, shown.data(), shown.data() + shown.size());
    }
    d->CursorPos = int(ui.prompt_shown.to_display(e.cursor));
    d->SelectionStart = d->SelectionEnd = d->CursorPos;
  }
  ui.prompt_cursor = size_t(d->CursorPos);
  return 0;
}

// The prompt: the files in prompts/ as radio buttons, and a box for your own.
void prompt_section(UiState& ui, Controller* ctl, const ControllerState& cs) {
  ImGui::BeginDisabled(!ui.engine_ready || ui.replay);
  ImGui::TextDisabled("Prompt");
  int n = int(ui.prompts.size());
  const ImGuiStyle& style = ImGui::GetStyle();
  float row_end = 0;  // right edge of the last radio button on the row
  for (int i = 0; i < n; ++i) {
    // The prompt files fill rows as wide as the column; a name that does not fit starts
    // the next row (no button is cut by the column's edge).
    const float w = ImGui::GetFrameHeight() + style.ItemInnerSpacing.x +
                    ImGui::CalcTextSize(ui.prompts[size_t(i)].name.c_str()).x;
    if (i && row_end + style.ItemSpacing.x + w <= ImGui::GetContentRegionMax().x)
      ImGui::SameLine();
    if (ImGui::RadioButton(ui.prompts[size_t(i)].name.c_str(), ui.prompt_index == i)) {
      ui.prompt_index = i;
      ui.custom_prompt = ui.prompts[size_t(i)].spec.text;
      ui.custom_chat = ui.prompts[size_t(i)].spec.chat;
      send(ctl, CmdReset{ui.prompts[size_t(i)].spec, cs.playing});
    }
    row_end = ImGui::GetItemRectMax().x - ImGui::GetWindowPos().x;
  }
  if (ui.custom_prompt.empty() && n > 0) {
    const PromptSpec& cur = ui.prompts[size_t(std::clamp(ui.prompt_index, 0, n - 1))].spec;
    ui.custom_prompt = cur.text;
    ui.custom_chat = cur.chat;
  }
  // Enter runs the text (Ctrl+Enter for a new line); editing it makes it "yours". Long
  // lines wrap at the box's width (room kept for its scroll bar); the box's size is fixed,
  // so nothing under it moves as the text grows.
  const float box_h = ImGui::GetTextLineHeight() * 5.0f + style.FramePadding.y * 2;
  const float wrap_w = std::max(ImGui::GetContentRegionAvail().x - 2.0f * style.FramePadding.x -
                                    style.ScrollbarSize - 2.0f,
                                4.0f * ImGui::GetFontSize());
  if (!ui.prompt_editing &&
      (ui.prompt_shown_for != ui.custom_prompt || ui.prompt_wrap_width != wrap_w)) {
    ui.prompt_shown = soft_wrap(ui.custom_prompt, wrap_w, text_width);
    ui.prompt_box = ui.prompt_shown.text;
    ui.prompt_shown_for = ui.custom_prompt;
    ui.prompt_wrap_width = wrap_w;
  }
  bool run = ImGui::InputTextMultiline(
      "##prompt", &ui.prompt_box, ImVec2(-1.0f, box_h),
      ImGuiInputTextFlags_EnterReturnsTrue | ImGuiInputTextFlags_CtrlEnterForNewLine |
          ImGuiInputTextFlags_NoHorizontalScroll | ImGuiInputTextFlags_CallbackEdit |
          ImGuiInputTextFlags_CallbackAlways,
      prompt_box_callback, &ui);
  ui.prompt_editing = ImGui::IsItemActive();
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Type your own prompt; Enter runs it (Ctrl+Enter: new line)");
  bool chat_changed = ImGui::RadioButton("raw text", !ui.custom_chat);
  if (chat_changed) ui.custom_chat = false;
  ImGui::SameLine();
  if (ImGui::RadioButton("chat turn", ui.custom_chat)) {
    ui.custom_chat = true;
    chat_changed = true;
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Wrap the text as one user turn in the model's chat template");
  ImGui::SameLine();
  run |= ImGui::Button("Run");
  if (run || chat_changed) {
    // The box's text becomes the selected prompt (an entry "yours"), so Reset and Play
    // in the toolbar use it too.
    PromptSpec spec{ui.custom_prompt, ui.custom_chat};
    auto it = std::find_if(ui.prompts.begin(), ui.prompts.end(),
                           [](const PromptChoice& c) { return c.name == "yours"; });
    bool same = n > 0 &&
                ui.prompts[size_t(std::clamp(ui.prompt_index, 0, n - 1))].spec.text == spec.text &&
                ui.prompts[size_t(std::clamp(ui.prompt_index, 0, n - 1))].spec.chat == spec.chat;
    if (!same) {
      if (it == ui.prompts.end()) it = ui.prompts.insert(ui.prompts.end(), {"yours", spec});
      it->spec = spec;
      ui.prompt_index = int(it - ui.prompts.begin());
    }
    if (run) send(ctl, CmdReset{spec, true});
  }
  ImGui::EndDisabled();
  if (ui.replay) ImGui::TextDisabled("a recording plays its own prompt and settings");
}

// Pace, a recording's too (the transport buttons and the cache mode are in the toolbar).
void pace_section(UiState& ui, Controller* ctl) {
  ImGui::Separator();
  ImGui::TextDisabled("Generation");
  ImGui::BeginDisabled(!ui.engine_ready);
  if (ImGui::Checkbox("as fast as possible", &ui.speed_max))
    send(ctl, CmdSpeed{ui.speed_max ? kSpeedMax : ui.speed});
  ImGui::BeginDisabled(ui.speed_max);
  if (ImGui::SliderFloat("tok/s", &ui.speed, kSpeedMin, kSpeedTop, "%.2f",
                         ImGuiSliderFlags_Logarithmic))
    send(ctl, CmdSpeed{ui.speed});
  ImGui::EndDisabled();
  ImGui::EndDisabled();
}

// Length and compare modes: this prompt with the cache and without it.
void length_and_compare(UiState& ui, Controller* ctl, const ControllerState& cs) {
  const int n = int(ui.prompts.size());
  if (ImGui::SliderInt("max tokens", &ui.max_tokens, 1, 4096))
    send(ctl, CmdMaxTokens{ui.max_tokens});

  // The compute story in one click: this prompt with the cache and without it, one run after
  // the other or both at once, step by step.
  const bool comparing = cs.compare != ComparePhase::None;
  ImGui::BeginDisabled(comparing || n == 0);
  if (ImGui::Button("Compare modes") && n > 0)
    send(ctl, CmdCompare{ui.prompts[size_t(std::clamp(ui.prompt_index, 0, n - 1))].spec,
                         ui.compare_steps, ui.compare_interleaved});
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        ui.compare_interleaved
            ? "Run this prompt %d steps with the KV cache and %d steps without it,\n"
              "one step of each in turn, as fast as the engine goes; the Plots\n"
              "section compares the two. Both runs must sample the same tokens."
            : "Run this prompt %d steps with the KV cache, then %d steps without it,\n"
              "as fast as the engine goes; the Plots section compares the two.\n"
              "Both runs must sample the same tokens.",
        ui.compare_steps, ui.compare_steps);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(-1.0f);
  ImGui::SliderInt("##compare_steps", &ui.compare_steps, 4, 256, "%d steps each");
  // One line either way: how to run the comparison, or, while it runs, which run is going.
  if (comparing) {
    ImGui::AlignTextToFramePadding();
    ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.3f, 1.0f), "%s",
                       cs.compare == ComparePhase::Interleaved ? "running both, step by step..."
                       : cs.compare == ComparePhase::CacheLeg  ? "running with the KV cache..."
                                                               : "running without the cache...");
  } else {
    // Short labels: both fit one line of the narrowest column (the tooltips say more).
    int order = ui.compare_interleaved ? 1 : 0;
    ImGui::RadioButton("sequential", &order, 0);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("The whole KV CACHE run, then the whole NO CACHE run.");
    ImGui::SameLine();
    ImGui::RadioButton("interleaved", &order, 1);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "One KV CACHE step, then one NO CACHE step, and so on: both runs see\n"
          "the same machine load, so their times compare fairly.");
    ui.compare_interleaved = order == 1;
  }
}

// Temperature, top-k, top-p and the seed.
void sampling_section(UiState& ui, Controller* ctl) {
  if (ImGui::TreeNode("Sampling")) {
    bool s = ImGui::SliderFloat("temperature", &ui.sampler.temperature, 0.0f, 2.0f, "%.2f");
    s |= ImGui::SliderInt("top-k", &ui.sampler.top_k, 0, 200);
    s |= ImGui::SliderFloat("top-p", &ui.sampler.top_p, 0.05f, 1.0f, "%.2f");
    int seed = int(ui.sampler.seed);
    if (ImGui::InputInt("seed", &seed)) {
      ui.sampler.seed = uint64_t(std::max(seed, 0));
      s = true;
    }
    if (s) send(ctl, CmdSampler{ui.sampler});
    ImGui::TextDisabled(ui.sampler.temperature <= 0 ? "greedy (temperature 0)" : "sampling");
    ImGui::TreePop();
  }
}

// What the beams show: which layer and heads, the sink, the KV blocks' colouring, labels.
void beams_section(UiState& ui, Controller* ctl, const Timeline& tl) {
  // What the beams show.
  ImGui::Separator();
  ImGui::TextDisabled("Attention beams");
  int L = std::max(ui.facts.n_layer, 1), H = std::max(ui.facts.n_head, 1);
  ImGui::Checkbox("all layers (mean)", &ui.view.all_layers);
  ImGui::BeginDisabled(ui.view.all_layers);
  // The middle layer stays "middle" until the model's layers are known (the engine's ready
  // event resolves it): a frame drawn while the model loads must not pin layer 0.
  int layer = ui.view.layer == kMiddleLayer ? L / 2 : ui.view.layer;
  if (ui.facts.n_layer > 0 && ui.view.layer == kMiddleLayer) ui.view.layer = layer;
  if (ImGui::SliderInt("layer", &layer, 0, L - 1)) ui.view.layer = layer;
  ImGui::EndDisabled();
  const char* aggs[] = {"single head", "mean over heads", "max over heads"};
  int agg = int(ui.view.aggregation);
  if (ImGui::Combo("heads", &agg, aggs, 3)) ui.view.aggregation = HeadAggregation(agg);
  ImGui::BeginDisabled(ui.view.aggregation != HeadAggregation::Single);
  ImGui::SliderInt("head", &ui.view.head, 0, H - 1);
  ImGui::EndDisabled();
  ImGui::Checkbox("without the sink (pos 0)", &ui.view.renormalize_sink);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Position 0 usually takes most of the attention (an attention sink).\n"
        "On: drop it and renormalize the rest to sum 1. Off: the real weights.");
  ImGui::Checkbox("color KV blocks by V norm", &ui.view.color_by_v);
  if (ImGui::Checkbox("color KV blocks by quantization error", &ui.view.color_by_error)) {
    ui.engine_options.kv_errors = ui.view.color_by_error;  // kept when the model reopens
    send(ctl, CmdKvErrors{ui.view.color_by_error});
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "The engine measures, for every K/V row it writes from now on, how far the\n"
        "cache's stored row is from the f32 row: ||x - stored(x)|| / ||x||, per layer\n"
        "and position (K, or V with the box above). Measured only while this is on.");
  if (ui.view.color_by_error)
    kv_error_legend(ui, tl);
  else
    kv_norm_legend(ui);
  ImGui::Checkbox("token labels", &ui.view.labels);
}

}  // namespace

void panel_controls(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl) {
  prompt_section(ui, ctl, cs);
  // Sliders and combos leave room for their labels ("temperature" is the longest).
  const ImGuiStyle& style = ImGui::GetStyle();
  ImGui::PushItemWidth(-(ImGui::CalcTextSize("temperature").x + style.ItemInnerSpacing.x));
  pace_section(ui, ctl);
  ImGui::BeginDisabled(!ui.engine_ready || ui.replay);
  length_and_compare(ui, ctl, cs);
  sampling_section(ui, ctl);
  ImGui::EndDisabled();
  beams_section(ui, ctl, tl);
  ImGui::PopItemWidth();
}

}  // namespace kvscope::app
