// ui_state.h — what the panels edit and read each frame (UI thread only).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "app/controller.h"
#include "app/engine_setup.h"
#include "app/scene_builder.h"
#include "render/camera.h"

namespace kvscope::app {

// Model dimensions the UI needs (copied once; the Session lives on the worker).
struct ModelFacts {
  std::string name, backend, kv_dtype = "f16";
  int n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_embd = 0, n_vocab = 0;
  uint64_t block_macs_per_token = 0;
  uint64_t kv_bytes_per_token = 0;
};

struct UiState {
  ViewOptions view;
  render::CameraPreset preset = render::CameraPreset::ThreeQuarter;
  bool preset_changed = true;
  std::vector<PromptChoice> prompts;
  int prompt_index = 0;
  std::string custom_prompt;
  float speed = 4.0f;
  bool speed_max = false;
  CacheMode mode = CacheMode::Cache;
  SamplerConfig sampler;
  int max_tokens = 200;
  ModelFacts facts;
  bool engine_ready = false;
  std::string error;             // shown in a modal until dismissed
  std::string notice;            // one-line status (e.g. backend fallback)
  double last_step_time = -1e9;  // glfwGetTime() when the newest trace arrived
  std::deque<double> step_arrivals;  // arrival times of the last few traces (observed tok/s)
  int hovered_pos = -1;
};

// One panel per file (panel_*.cpp). Each draws one ImGui window.
void panel_controls(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl);
void panel_stats(const UiState& ui, const ControllerState& cs, const Timeline& tl);
// A centered banner "computing step N... 1.2 s" while a step runs longer than a blink.
void overlay_computing(const ControllerState& cs, const Timeline& tl);
// Generated tokens per second over the recent arrivals (0 when fewer than two).
double observed_tokens_per_s(const UiState& ui);
void panel_plots(const UiState& ui, const Timeline& tl);
void panel_candidates(const Timeline& tl);
void panel_inspector(const UiState& ui, const Timeline& tl);
void panel_error_modal(UiState& ui);

std::string format_bytes(uint64_t b);
std::string format_count(double v);  // 1.2k, 3.4M, 5.6G, 7.8T

}  // namespace kvscope::app
