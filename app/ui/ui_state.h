// ui_state.h — what the panels edit and read each frame (UI thread only).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <imgui.h>

#include "app/core/controller.h"
#include "app/core/engine_setup.h"
#include "app/core/memory_whatif.h"
#include "app/core/model_choices.h"
#include "app/ui/prompt_wrap.h"
#include "app/core/quality_job.h"
#include "app/scene/scene_builder.h"
#include "app/scene/window_layout.h"
#include "render/camera.h"

namespace kvscope::app {

struct ServingUi;  // serving_ui.h

// The memory formula's shape for a model (engine/kv_memory.h).
KvMemoryShape facts_memory_shape(const ModelFacts& f);

// A message for the user that does not need an answer: shown in a corner of the 3D view
// until dismissed (or until it expires), never over the panels.
struct Notice {
  uint64_t id = 0;
  std::string text;
  double seconds = 0;    // > 0: goes away by itself this long after it first shows
  double shown_at = -1;  // ImGui time it first showed (-1: not yet)
};

// The transcript's word wrapping, kept across frames: token widths are measured once,
// lines are rebuilt only when the text or the width changes.
struct TranscriptCache {
  uint64_t run = ~0ull;
  std::vector<std::string> texts;  // [T] display text of each token
  std::vector<float> widths;       // [T] width in points
  std::vector<bool> breaks;        // [T] the token ends a line (a newline in it)
  float wrap = -1;                 // width the lines were built for
  std::vector<int> line_first;     // first token of each line
  size_t laid_out = 0;             // tokens placed on lines
  float font_size = 0;
  int follow_pos = -1;    // last position scrolled to from the 3D view
  int viewed_index = -1;  // token of the older step looked at, last scrolled to (-1: live)
};

// A read-out a frame put on screen, and where: the story strip notes its numbers and words
// so the tests can check that what a person came for lies inside the window, not scrolled
// or clipped away.
struct ShownItem {
  std::string what;  // "COMPUTE", "KV_CACHE", "SEQ_LEN", "last words", "top candidate"
  std::string text;  // the text drawn
  UiRect rect;       // its rectangle, window points
  UiRect clip;       // the visible part of the (child) window it was drawn in
};

// The save dialog (panel_save.cpp): what it writes, into which folder, under which name.
enum class SaveKind { Run, Stats, ViewPng };
struct SaveDialog {
  bool open_request = false;  // open it on the next frame
  bool open = false;          // it is showing
  SaveKind kind = SaveKind::Run;
  std::string folder;                   // the folder it writes into (absolute)
  std::string folder_box;               // the folder box's text (taken on Enter)
  std::string name;                     // the file name box
  std::vector<std::string> subfolders;  // of `folder`, sorted (hidden ones left out)
  std::string listed;                   // the folder `subfolders` lists
  std::string csv;  // Stats: the CSV, made when the dialog opens, so its size is exact
};

struct UiState {
  ViewOptions view;
  render::CameraPreset preset = render::CameraPreset::ThreeQuarter;
  bool preset_changed = true;
  std::vector<PromptChoice> prompts;
  int prompt_index = 0;
  std::string custom_prompt;       // the prompt box
  bool custom_chat = false;        // the box's text as a chat turn (else raw text)
  // The prompt box shows custom_prompt soft-wrapped to its width (prompt_wrap.h): the
  // wrapping, the box's buffer, the prompt and width it was made for, whether the box was
  // being edited last frame and its cursor at the last callback.
  SoftWrapped prompt_shown;
  std::string prompt_box;
  std::string prompt_shown_for;
  float prompt_wrap_width = -1;
  bool prompt_editing = false;
  size_t prompt_cursor = 0;
  int compare_steps = 48;          // steps of each run of "compare modes"
  bool compare_interleaved = false;  // both runs step by step in turn, not one after the other
  std::string model_choice;        // the model picker: a built-in name or a GGUF path
  std::vector<ModelChoice> model_list;  // the picker's list (model_choices.h)
  double model_list_time = -1;          // ImGui time it was made
  EngineOptions cache_edit;             // the Run section's KV cache being edited
  bool cache_edit_set = false;          // cache_edit starts from engine_options
  std::string run_path = "kvscope-run.kvs";     // File: save / open a recording
  std::string csv_path = "kvscope-stats.csv";   // File: export the stats
  int scrub_request = 0;           // > 0: view that step (applied by apply_events); -1: live
  std::string solo_sections;       // screenshots: "Run,Plots" opens those sections only
  bool plots_log_y = false;        // Plots: logarithmic y axes
  bool plots_window = false;       // Plots: the large view, a window of its own
  uint64_t rss_bytes = 0;          // the app's resident memory (sampled twice a second)
  double rss_time = -1;
  float speed = 4.0f;
  bool speed_max = false;
  CacheMode mode = CacheMode::Cache;
  SamplerConfig sampler;
  int max_tokens = 200;
  ModelFacts facts;
  bool engine_ready = false;     // a model or a recording is loaded
  bool replay = false;           // it is a recording (no model)
  std::string replay_path;       // the recording's file
  EngineOptions engine_options;  // how the current model was (or is being) opened
  bool autoplay = false;         // play as soon as a model or recording is loaded
  std::string error;            // shown in a modal until dismissed
  std::vector<Notice> notices;  // dismissable messages (e.g. backend fallback)
  uint64_t next_notice_id = 1;
  // Every notice shown, oldest first ("12:34:56  text"), for the Run section's Messages list
  // once the notice itself has faded (at most kNoticeLogSize).
  std::deque<std::string> notice_log;
  LayoutPrefs layout_prefs;    // side columns open/closed, widths
  int splitter_drag = 0;       // a column's inner edge being dragged: -1 left, 1 right
  UiLayout layout;             // this frame's regions (set by draw_frame_ui)
  bool export_png = false;     // the save dialog asked to save the current view as a PNG
  std::string export_png_path;  // ... to this file
  SaveDialog save;
  int panel_hovered_pos = -1;  // position hovered in the transcript or overview (-1: none)
  int look_at_pos = -1;        // a position the overview asked the camera to show
  TranscriptCache transcript;
  std::vector<ShownItem> shown;  // this frame's read-outs (cleared by draw_frame_ui)
  double frame_work_ms = 0;  // what drawing one frame costs lately (frames are paced: see gui_loop.h)
  double last_step_time = -1e9;      // glfwGetTime() when the newest trace arrived
  int hovered_pos = -1;
  // KV memory: the run's own cache settings, and the what-if panel's choice and context.
  WhatIfChoice run_kv;
  WhatIfChoice whatif;
  bool whatif_set = false;  // the what-if starts from run_kv
  int whatif_ctx = 100000;
  int whatif_window = 256;  // the window offered when sink + window is switched on
  // Cache quality: the live comparison, its candidate cache and length.
  std::shared_ptr<QualityJob> quality = std::make_shared<QualityJob>();
  WhatIfChoice quality_kv{{KvDtype::Q8_0, KvDtype::Q8_0}};
  int quality_steps = 64;
  // The Serving view (serving_ui.h) instead of the single sequence, and its state (made
  // when the view is first shown).
  bool serving = false;
  std::shared_ptr<ServingUi> serving_ui;
};

// Adds a dismissable notice over the 3D view that fades away by itself `seconds` after it
// first shows (<= 0: it stays until dismissed); its text also goes to ui.notice_log.
inline constexpr double kNoticeSeconds = 8.0;
inline constexpr double kNoticeFadeSeconds = 1.0;  // the last part of those, fading out
inline constexpr size_t kNoticeLogSize = 100;
void add_notice(UiState& ui, std::string text, double seconds = kNoticeSeconds);

// One panel per file (panel_*.cpp). Section panels draw their content only, into the
// region app_frame.cpp gives them (no Begin/End of their own).
void panel_controls(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl);
// The Run section: which model or recording runs, the history slider, save / open / export.
void panel_run(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl);
void panel_stats(const UiState& ui, const ControllerState& cs, const Timeline& tl);
void panel_plots(UiState& ui, const Timeline& tl);
// The Plots section's large view: a floating window, the plots side by side and taller,
// while ui.plots_window (its close button clears it).
void panel_plots_window(UiState& ui, const Timeline& tl);
void panel_candidates(const Timeline& tl);
// The text so far, token by token, in a `size` child window that follows the newest words;
// hovering a token sets ui.panel_hovered_pos, and the token hovered in the 3D view
// (ui.hovered_pos) is highlighted here. Notes its last line as "last words" in ui.shown.
void panel_transcript(UiState& ui, const Timeline& tl, ImVec2 size);
// The story strip under the view: COMPUTE, KV_CACHE and SEQ_LEN of the viewed step, the
// run's status, the text so far and the step's top candidates (panel_story.cpp).
void panel_story(UiState& ui, const ControllerState& cs, const Timeline& tl);
// Records the last item drawn (or `rect`) in ui.shown as `what` showing `text`.
void note_shown(UiState& ui, const char* what, std::string text);
void note_shown(UiState& ui, const char* what, std::string text, ImVec2 min, ImVec2 max);
// The toolbar: transport (fixed places), cache mode, camera presets, export, status.
void panel_toolbar(UiState& ui, Controller* ctl, const ControllerState& cs, const Timeline& tl);
// The bottom strip: the whole sequence at a glance with this step's attention marks and
// the part the 3D view shows; `shown` = [first, last] positions in view (or -1, -1).
void panel_overview(UiState& ui, const Timeline& tl, int shown_first, int shown_last);
// The KV memory section: this run's bytes next to the formula, and the what-if table.
void panel_memory(UiState& ui, const Timeline& tl);
// The Cache quality section: the live comparison against the f16 full-context reference.
void panel_quality(UiState& ui);
// The comparison the Cache quality section starts: its candidate cache on `prompt`.
QualitySpec quality_spec(const UiState& ui, const PromptSpec& prompt);
// The Heads section: which query heads share which KV head; click one to light it.
void panel_heads(UiState& ui);
// The save dialog: opens it for `kind` (Save run, Export stats, Export PNG), starting from
// the file the Files section names (or the next free kvscope-view-NNN.png).
void open_save_dialog(UiState& ui, SaveKind kind, const Timeline& tl);
// Draws it while open: the folder (its subfolders to step into), the file name, and the
// size the file will have before anything is written.
void panel_save_dialog(UiState& ui, Controller* ctl, const ControllerState& cs,
                       const Timeline& tl);
// The bytes the dialog's file will take (exact for the stats; the run's history file as it
// is now; a view PNG's pixels before compression, an upper bound).
uint64_t save_dialog_bytes(const UiState& ui, const ControllerState& cs);
// Writes the dialog's file (or asks the controller to); false, with ui.error set, when it
// cannot. Closes the dialog on success.
bool save_dialog_confirm(UiState& ui, Controller* ctl, const ControllerState& cs,
                         const Timeline& tl);
// Floating windows: the tooltip of the hovered token, the error modal.
void panel_inspector(const UiState& ui, const Timeline& tl);
void panel_error_modal(UiState& ui);

// The view options the scene is built with: the panels' choices plus the run's cache
// shape from the model facts (KV heads per layer, K/V types).
ViewOptions scene_options(const UiState& ui);

std::string format_bytes(uint64_t b);
std::string format_count(double v);  // 1.2k, 3.4M, 5.6G, 7.8T
// A combo of the KV cache element types (f32, f16, q8_0, q4_0); true when changed.
bool kv_type_combo(const char* label, KvDtype* t);

}  // namespace kvscope::app
