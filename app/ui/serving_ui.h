// serving_ui.h — the Serving view's panels around its 3D scene (app/scene/serving_scene.h):
// the workload and scheduler controls, the step's batch against the token budget, the
// waiting queue, the sequences, the pool's numbers and their plots over the steps, and the
// tooltips of the tile or lane under the pointer.
//
// The run behind it is a ServingRun (app/core/serving_run.h): the continuous-batching
// scheduler on the real model, on its own worker thread. Shared by the window loop and the
// headless capture (`kvscope --view serving --screenshot OUT.png`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "app/core/serving_record.h"
#include "app/core/serving_run.h"
#include "app/scene/serving_scene.h"

namespace kvscope::serve {
class WatchedServer;  // app/serve/serve_watch.h (builds with `kvscope serve` only)
}

namespace kvscope::app {

struct UiState;

// What the controls set; a Start (or Restart) runs it.
struct ServingSettings {
  int requests = 8;  // drawn from the prompts in turn
  bool use_prefix = true;  // put the shared system prompt before every prompt
  std::string prefix;  // the shared system prompt (default: kDefaultServingPrefix)
  std::string typed;   // the prompt box: typed prompts join the workload as requests
  std::vector<std::string> typed_prompts;
  int arrival_kind = 1;  // 0 all at once, 1 every N steps, 2 Poisson
  int every = 2;
  float rate = 0.5f;  // Poisson: requests per step
  int seed = 1;
  int max_tokens = 48;
  int n = 1;  // samples per request
  int beams = 0;  // beam search of every request with this many beams (0: sampling)
  float length_penalty = 1.0f;
  float temperature = 0.7f;
  int max_seqs = 8;
  int max_batch_tokens = 128;
  int block = 16;
  int pool_blocks = 64;  // small enough to watch; lower it to provoke preemption
  int context = 256;     // positions a sequence may hold
  bool prefix_caching = true;
  // Speculative decoding of every sequence: 0 off, 1 ngram (prompt lookup), 2 early exit
  // (the model's first exit_layers layers as the draft), 3 a draft model (the GGUF at
  // draft_path, with the model's vocabulary); draft_max tokens a step.
  int speculative = 0;
  int exit_layers = 12;
  std::string draft_path;
  int draft_max = 4;
  float speed = 3.0f;  // steps per second; 0: as fast as the engine goes
  std::string record_path;  // non-empty: each run is recorded into this file (--record)
};

inline constexpr const char* kDefaultServingPrefix =
    "You are a helpful assistant running inside kvscope, a tool that shows how a language "
    "model serves many requests at once. Answer clearly and briefly, in plain English.\n\n";

// The workload the settings describe, with `prompts` (the app's prompt texts, used raw).
ServingConfig serving_config(const ServingSettings& s, const std::vector<PromptSpec>& prompts);
// "every:2", "poisson:0.5", "all".
std::string arrival_spec(const ServingSettings& s);

struct ServingUi {
  ServingSettings settings;
  std::unique_ptr<ServingRun> run;
  ServingView view;
  std::shared_ptr<const ServingSnapshot> snap;  // the one this frame draws
  int selected_seq = -1;
  int hovered_seq_panel = -1;  // a lane hovered in the Sequences table
  int last_step = -1;          // the step the animation clock counts from
  double last_step_time = -1e9;
  bool playing = false;
  bool started = false;
  // Serve: an OpenAI-compatible endpoint on this model whose requests the view shows
  // instead of the workload's (null: off).
  std::shared_ptr<serve::WatchedServer> server;
  int serve_port = 8080;
  std::string serve_error;
  // A recorded serving run played back without the model (--view serving --replay):
  // the snapshot at `replay_index`, advanced by Play at the speed, or by Step.
  std::unique_ptr<ServingReplay> replay;
  int replay_index = 0;
  double replay_advanced = -1;  // when the index last moved (the UI's clock)
};

// Opens a recorded serving run for playback (the run of the workload stops); an error
// names the file and what is wrong with it.
Status serving_open_replay(ServingUi& s, const std::string& path);
// The replay's snapshot at `index` (clamped to the recording); null on a read error,
// with `error` set.
std::shared_ptr<const ServingSnapshot> serving_replay_at(ServingUi& s, int index,
                                                         std::string* error);

// Whether this build has the Serve switch (`kvscope serve` built in).
bool serving_can_serve();
// Starts the endpoint on 127.0.0.1:`s.serve_port` with the Scheduler settings (the run of
// the workload pauses); false with s.serve_error set when it cannot.
bool serving_serve_start(UiState& ui, ServingUi& s);
void serving_serve_stop(ServingUi& s);

// Starts (or restarts) the run the settings describe on the app's model.
void serving_start(UiState& ui, ServingUi& s, bool play);
// Takes the run's newest snapshot (and notes when a new step arrived).
void serving_sync(ServingUi& s, double now);
// The panels around the view (computes ui.layout as the single view does).
void draw_serving_ui(UiState& ui, ServingUi& s);
// What the view draws this frame.
ServingFrame serving_frame(UiState& ui, ServingUi& s, double now, float dt);
// After the view's update: reference counts over shared tiles, the tooltip of what is
// under the pointer, and a click selects a lane.
void serving_overlay(UiState& ui, ServingUi& s, bool clicked);

// The colour of a sequence's palette entry for ImGui.
unsigned serving_im_color(int palette, float alpha = 1.0f);

}  // namespace kvscope::app
