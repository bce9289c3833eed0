// app_main.cpp — the app's command line: the window (gui_loop.cpp) or the offscreen
// screenshot (app_capture.cpp). Parsed like the subcommands (cli::parse_options) from the
// shared option groups (app/options): engine, KV cache, prompt file, capture and window.
#include "app/ui/app_main.h"

#include <string>

#include "app/options/capture_options.h"
#include "app/options/engine_options.h"
#include "app/options/kv_options.h"
#include "app/options/options.h"
#include "app/options/prompt_options.h"
#include "app/options/sampler_options.h"
#include "app/options/scheduler_options.h"
#include "app/options/speculative_options.h"
#include "app/ui/app_capture.h"
#include "app/ui/serving_capture.h"
#include "app/core/controller.h"
#include "app/ui/gui_loop.h"
#include "render/camera.h"

namespace kvscope::app {
namespace {

// The Serving view's options (the scheduler's shared ones, and the workload's).
struct ServingArgs {
  std::string view = "single";
  int requests = 8;
  std::string arrival = "every:2";
  int n = 1;
  int beams = 0;
  float length_penalty = 1.0f;
  bool no_shared_prefix = false;
  std::string record;
  cli::SchedulerOptions sched;
  cli::SpeculativeOptions spec;
  float temp = 0.7f;
};

void add_serving_options(CLI::App& app, ServingArgs& a) {
  app.add_option("--view", a.view,
                 "What the app shows: single (one sequence, its cache and attention) or serving "
                 "(many requests from one pool of KV blocks)")
      ->check(CLI::IsMember({"single", "serving"}));
  app.add_option("--requests", a.requests, "Serving view: requests made from prompts/, in turn")
      ->check(cli::Range(0, 256));
  cli::add_arrival_option(app, a.arrival);
  cli::add_samples_option(app, a.n);
  cli::add_beam_options(app, a.beams, a.length_penalty);
  app.add_flag("--no-shared-prefix", a.no_shared_prefix,
               "Serving view: no shared system prompt before the prompts");
  cli::add_scheduling_options(app, a.sched, /*pool_mib=*/false);
  cli::add_speculative_options(app, a.spec, /*draft_model=*/true);
  cli::add_temperature_option(app, a.temp);
  app.add_option("--record", a.record,
                 "Serving view: record each run into this file (play it back with --view "
                 "serving --replay FILE)");
}

// A Serving view option given with the single view: refused, not ignored.
Status check_serving_only(const CLI::App& app, bool serving) {
  if (serving) return Status::Ok();
  for (const char* name : {"--requests", "--arrival", "--n", "--no-shared-prefix",
                           "--kv-pool-blocks", "--max-seqs", "--max-batch-tokens",
                           "--no-prefix-cache", "--record", "--speculative", "--draft-max", "--temp",
                           "--beams", "--length-penalty"})
    if (app.count(name) > 0) return make_error(name, ": only with --view serving");
  return Status::Ok();
}

// The Serving view's settings from its options (the defaults where one is not given); an
// Error names a value the view cannot take.
Status apply_serving(const CLI::App& app, const ServingArgs& a, const cli::KvOptions& kv,
                     ServingSettings* s) {
  const auto given = [&](const char* name) { return app.count(name) > 0; };
  s->requests = a.requests;
  if (given("--arrival")) {
    if (a.arrival == "all") {
      s->arrival_kind = 0;
    } else if (a.arrival.rfind("every:", 0) == 0) {
      s->arrival_kind = 1;
      s->every = std::stoi(a.arrival.substr(6));
    } else {
      s->arrival_kind = 2;
      s->rate = std::stof(a.arrival.substr(8));
    }
  }
  s->n = a.n;
  if (given("--beams")) {
    if (a.n > 1) return make_error("--beams: beam search draws no samples (drop --n)");
    if (given("--speculative"))
      return make_error("--beams: beam search does not speculate (drop --speculative)");
    s->beams = a.beams;
  } else if (given("--length-penalty")) {
    return make_error("--length-penalty: it scores beams; give --beams K");
  }
  s->length_penalty = a.length_penalty;
  s->use_prefix = !a.no_shared_prefix;
  if (given("--max-seqs")) s->max_seqs = a.sched.max_seqs;
  if (given("--max-batch-tokens")) s->max_batch_tokens = a.sched.max_batch_tokens;
  if (given("--kv-pool-blocks")) s->pool_blocks = a.sched.pool_blocks;
  if (given("--kv-block")) s->block = kv.block;
  if (given("--ctx") && kv.ctx > 0) s->context = kv.ctx;
  s->prefix_caching = !a.sched.no_prefix;
  s->record_path = a.record;
  if (given("--temp")) s->temperature = a.temp;
  auto spec = cli::to_speculative_config(a.spec);
  if (!spec.ok()) return spec.error();
  s->speculative = spec->kind == DraftKind::Ngram       ? 1
                   : spec->kind == DraftKind::EarlyExit ? 2
                   : spec->kind == DraftKind::Model     ? 3
                                                        : 0;
  if (spec->kind == DraftKind::EarlyExit) s->exit_layers = spec->layers;
  if (spec->kind == DraftKind::Model) s->draft_path = spec->draft_path;
  s->draft_max = spec->draft_max;
  return Status::Ok();
}

struct Args : GuiOptions {
  bool screenshot = false;
  bool scene_only = false;  // --screenshot without the panels (the 3D view fills the image)
};

static_assert(cli::kSpeedOptionMin == double(kSpeedMin) && cli::kSpeedOptionMax == double(kSpeedTop),
              "--speed's bounds are the controller's");

// The parsed groups into the app's options. The values are in range already (the
// validators); what is left to refuse here (an unknown camera preset or cache type) is
// refused before anything is opened, as an Error naming the option.
Status apply(const CLI::App& app, const cli::EngineArgs& engine, const cli::KvOptions& kv,
             const cli::PromptOptions& prompt, const std::string& mode, int max_tokens,
             const cli::CaptureArgs& c, const cli::WindowArgs& w, Args* a) {
  CaptureOptions& cap = a->cap;
  const auto given = [&](const char* name) { return app.count(name) > 0; };
  cap.model_path = engine.model;
  cap.backend = engine.backend;
  cap.prompt_file = prompt.file;
  cap.mode = cli::mode_from_option(mode);
  if (given("--max-tokens")) cap.max_tokens = max_tokens;
  SessionConfig cfg;
  KV_TRY(cli::apply_kv_options(kv, cfg));
  cap.kv_types = cfg.kv_types;
  cap.limits = cfg.limits;
  cap.kv_policy = cfg.kv_policy;
  cap.kv_block = cfg.kv_block;
  cap.kv_errors = c.kv_error;
  cap.view.color_by_error = c.kv_error;

  a->screenshot = given("--screenshot");
  cap.out_path = c.screenshot;
  cap.replay_path = c.replay;
  if (given("--steps")) {
    cap.steps = c.steps;
    cap.steps_given = true;
  }
  if (given("--size")) {
    cli::parse_size(c.size, &cap.width, &cap.height);
    a->size_given = true;
  }
  if (given("--camera")) {
    cap.more_cameras.clear();
    bool first = true;
    for (size_t start = 0, i = 0; i <= c.camera.size(); ++i) {
      if (i < c.camera.size() && c.camera[i] != ',') continue;
      const std::string name = c.camera.substr(start, i - start);
      start = i + 1;
      auto p = render::parse_camera_preset(name);
      if (!p)
        return make_error("--camera: ", name, " is not a camera preset (choose ",
                          cli::kCameraChoices, "; or a list a,b)");
      if (first)
        cap.camera = *p;
      else
        cap.more_cameras.push_back(*p);
      first = false;
    }
  }
  if (given("--layer")) {
    cap.view.layer = c.layer;
    cap.view.all_layers = false;
  }
  if (c.all_layers) cap.view.all_layers = true;
  if (given("--head")) {
    if (c.head == "mean") {
      cap.view.aggregation = HeadAggregation::Mean;
    } else if (c.head == "max") {
      cap.view.aggregation = HeadAggregation::Max;
    } else {
      cap.view.head = std::stoi(c.head);
      cap.view.aggregation = HeadAggregation::Single;
    }
  }
  if (c.no_sink) cap.view.renormalize_sink = true;
  a->scene_only = c.scene_only;
  if (given("--highlight")) cap.view.hovered_pos = c.highlight;
  if (c.compare_modes || c.compare_interleaved) cap.compare = true;
  cap.compare_interleaved = c.compare_interleaved;
  if (given("--view-step")) cap.view_step = c.view_step;
  cap.sections = c.sections;
  if (given("--speed")) cap.speed = c.speed == "max" ? -1.0f : std::stof(c.speed);
  if (given("--look-at")) cap.look_at_pos = c.look_at;
  if (given("--anim-time")) cap.since_step = c.anim_time;
  if (given("--cache-quality")) cap.quality_steps = c.cache_quality;

  a->play = w.play;
  if (given("--frames")) a->quit_after = w.frames;
  a->window_shot = w.window_shot;
  if (given("--measure")) a->measure_steps = w.measure;
  if (given("--ui-nice")) a->ui_nice = w.ui_nice;
  return Status::Ok();
}

const char* kFooter =
    "kvscope --screenshot OUT.png [options] draws the app offscreen (no display needed);\n"
    "kvscope --replay RUN.kvs [options] plays a recorded run (no model).\n"
    "Subcommands (each has --help): generate, record, export, compare, perplexity, bench,\n"
    "batch, serve, bench-render.";

}  // namespace

int run_app(int argc, char** argv) {
  CLI::App app{"The desktop app: an LLM generating token by token, its KV cache and attention.",
               "kvscope"};
  app.footer(kFooter);
  cli::EngineArgs engine;
  cli::add_engine_options(app, engine, /*threads=*/false);
  cli::PromptOptions prompt;
  cli::add_prompt_options(app, prompt, /*file_only=*/true);
  std::string mode = "cache";
  cli::add_mode_option(app, mode);
  int max_tokens = 0;
  cli::add_max_tokens_option(app, max_tokens, "Tokens to generate (default: the app's)");
  cli::KvOptions kv;
  cli::add_kv_options(app, kv);
  cli::CaptureArgs capture;
  cli::add_capture_options(app, capture);
  cli::WindowArgs window;
  cli::add_window_options(app, window);
  ServingArgs serving;
  add_serving_options(app, serving);
  if (int rc = cli::parse_options(app, argc, argv); rc >= 0) return rc;
  Args args;
  if (Status st = apply(app, engine, kv, prompt, mode, max_tokens, capture, window, &args);
      !st.ok())
    return cli::fail(st.message());  // one line, exit status 1
  args.serving = serving.view == "serving";
  // A bad value is refused as every command refuses it, before "only with --view serving".
  if (Status st = apply_serving(app, serving, kv, &args.serving_settings); !st.ok())
    return cli::fail(st.message());
  if (Status st = check_serving_only(app, args.serving); !st.ok()) return cli::fail(st.message());
  if (app.count("--max-tokens")) args.serving_settings.max_tokens = max_tokens;
  if (args.screenshot && args.serving && args.measure_steps > 0)
    return cli::fail("--measure with --screenshot measures the single view, not --view serving");
  if (args.screenshot && args.serving)
    return run_serving_screenshot(args.cap, args.serving_settings, !args.scene_only);
  if (args.screenshot && args.measure_steps > 0)
    return run_measure_offscreen(args, args.cap.out_path);
  if (args.screenshot) return run_screenshot(args.cap, !args.scene_only);
  return run_gui(args);
}

}  // namespace kvscope::app
