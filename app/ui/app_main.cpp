// app_main.cpp — the app's command line: the window (gui_loop.cpp) or the offscreen
// screenshot (app_capture.cpp).
#include "app/ui/app_main.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "app/ui/app_capture.h"
#include "app/options/options.h"
#include "app/core/controller.h"
#include "app/ui/gui_loop.h"
#include "render/camera.h"

namespace kvscope::app {
namespace {

struct Args : GuiOptions {
  bool screenshot = false;
  bool scene_only = false;  // --screenshot without the panels (the 3D view fills the image)
};

bool parse_size(const char* s, int* w, int* h) {
  return std::sscanf(s, "%dx%d", w, h) == 2 && *w >= 16 && *h >= 16 && *w <= 8192 && *h <= 8192;
}

// A whole decimal integer in [lo, hi] (no trailing text, no overflow), or nothing.
std::optional<int> int_in(const char* v, long lo, long hi) {
  if (v == nullptr || *v == 0) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*end != 0 || errno == ERANGE || n < lo || n > hi) return std::nullopt;
  return int(n);
}

// Returns "" or an error line.
std::string parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&](const char** out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    const char* v = nullptr;
    if (k == "--help" || k == "-h") return "help";
    if (k == "--screenshot") {
      if (!value(&v)) return "--screenshot needs an output path";
      a->screenshot = true;
      a->cap.out_path = v;
    } else if (k == "--prompt-file") {
      if (!value(&v)) return "--prompt-file needs a path";
      a->cap.prompt_file = v;
    } else if (k == "--replay") {
      if (!value(&v)) return "--replay needs a run file (.kvs)";
      a->cap.replay_path = v;
    } else if (k == "--steps") {
      if (!value(&v)) return "--steps needs a number";
      const auto n = int_in(v, 1, 1 << 20);
      if (!n) return std::string("--steps ") + v + " is not a number in [1, 1048576]";
      a->cap.steps = *n;
      a->cap.steps_given = true;
    } else if (k == "--mode") {
      if (!value(&v)) return "--mode needs cache or nocache";
      if (!std::strcmp(v, "cache"))
        a->cap.mode = CacheMode::Cache;
      else if (!std::strcmp(v, "nocache"))
        a->cap.mode = CacheMode::NoCache;
      else
        return std::string("--mode ") + v + " (choose cache or nocache)";
    } else if (k == "--camera") {
      if (!value(&v)) return "--camera needs a preset";
      std::string list = v;
      a->cap.more_cameras.clear();
      bool first = true;
      for (size_t start = 0, i = 0; i <= list.size(); ++i) {
        if (i < list.size() && list[i] != ',') continue;
        std::string name = list.substr(start, i - start);
        start = i + 1;
        auto p = render::parse_camera_preset(name);
        if (!p) return "--camera " + name + " (choose top, side, front, 3/4, follow; or a list a,b)";
        if (first)
          a->cap.camera = *p;
        else
          a->cap.more_cameras.push_back(*p);
        first = false;
      }
    } else if (k == "--layer") {
      if (!value(&v)) return "--layer needs a number";
      const auto n = int_in(v, 0, 4095);
      if (!n) return std::string("--layer ") + v + " is not a layer number in [0, 4095]";
      a->cap.view.layer = *n;
      a->cap.view.all_layers = false;
    } else if (k == "--head") {
      if (!value(&v)) return "--head needs a number (or mean / max)";
      if (!std::strcmp(v, "mean"))
        a->cap.view.aggregation = HeadAggregation::Mean;
      else if (!std::strcmp(v, "max"))
        a->cap.view.aggregation = HeadAggregation::Max;
      else {
        const auto n = int_in(v, 0, 4095);
        if (!n) return std::string("--head ") + v + " is not mean, max or a head number in [0, 4095]";
        a->cap.view.head = *n;
        a->cap.view.aggregation = HeadAggregation::Single;
      }
    } else if (k == "--play") {
      a->play = true;
    } else if (k == "--frames") {
      const auto n = value(&v) ? int_in(v, 1, 1 << 30) : std::nullopt;
      if (!n) return "--frames needs a number in [1, 1073741824]";
      a->quit_after = *n;
    } else if (k == "--window-shot") {
      if (!value(&v)) return "--window-shot needs an output path";
      a->window_shot = v;
    } else if (k == "--measure") {
      const auto n = value(&v) ? int_in(v, 1, 1 << 20) : std::nullopt;
      if (!n) return "--measure needs a number of steps in [1, 1048576]";
      a->measure_steps = *n;
    } else if (k == "--ui-nice") {
      const auto n = value(&v) ? int_in(v, 0, 19) : std::nullopt;
      if (!n) return "--ui-nice needs 0..19";
      a->ui_nice = *n;
    } else if (k == "--highlight") {
      const auto n = value(&v) ? int_in(v, 0, 1 << 24) : std::nullopt;
      if (!n) return "--highlight needs a position in [0, 16777216]";
      a->cap.view.hovered_pos = *n;
    } else if (k == "--compare-modes") {
      a->cap.compare = true;
    } else if (k == "--compare-interleaved") {
      a->cap.compare = true;
      a->cap.compare_interleaved = true;
    } else if (k == "--view-step") {
      const auto n = value(&v) ? int_in(v, 1, 1 << 20) : std::nullopt;
      if (!n) return "--view-step needs a step number in [1, 1048576]";
      a->cap.view_step = *n;
    } else if (k == "--max-tokens") {
      const auto n = value(&v) ? int_in(v, 1, 1 << 20) : std::nullopt;
      if (!n) return "--max-tokens needs a number in [1, 1048576]";
      a->cap.max_tokens = *n;
    } else if (k == "--speed") {
      if (!value(&v)) return "--speed needs tokens per second in [0.25, 30] or max";
      if (!std::strcmp(v, "max")) {
        a->cap.speed = -1;
      } else {
        char* end = nullptr;
        double x = std::strtod(v, &end);
        if (!end || *end || !(x >= kSpeedMin && x <= kSpeedTop))
          return std::string("--speed ") + v + " (choose a number in [0.25, 30] or max)";
        a->cap.speed = float(x);
      }
    } else if (k == "--sections") {
      if (!value(&v)) return "--sections needs a list such as Run,Plots";
      a->cap.sections = v;
    } else if (k == "--scene-only") {
      a->scene_only = true;
    } else if (k == "--all-layers") {
      a->cap.view.all_layers = true;
    } else if (k == "--no-sink") {
      a->cap.view.renormalize_sink = true;
    } else if (k == "--size") {
      if (!value(&v) || !parse_size(v, &a->cap.width, &a->cap.height))
        return "--size needs WxH with both in [16, 8192], e.g. 1280x720";
      a->size_given = true;
    } else if (k == "--model") {
      if (!value(&v)) return "--model needs a built-in model name or a GGUF file path";
      a->cap.model_path = v;
    } else if (k == "--kv-type" || k == "--kv-type-k" || k == "--kv-type-v") {
      KvDtype t;
      if (!value(&v) || !kv_dtype_parse(v, &t))
        return k + " " + (v ? v : "") + ": unknown cache type (choose " + kv_dtype_choices() + ")";
      if (k != "--kv-type-v") a->cap.kv_types.k = t;
      if (k != "--kv-type-k") a->cap.kv_types.v = t;
    } else if (k == "--anim-time") {
      char* end = nullptr;
      const double x = value(&v) ? std::strtod(v, &end) : -1.0;
      if (!end || *end || !(x >= 0.0 && x <= 60.0))
        return "--anim-time needs seconds after the last step in [0, 60], e.g. 0.3";
      a->cap.since_step = x;
    } else if (k == "--kv-error") {
      a->cap.kv_errors = true;
      a->cap.view.color_by_error = true;
    } else if (k == "--ctx-full") {
      if (!value(&v) || !context_policy_parse(v, &a->cap.limits.on_full))
        return "--ctx-full " + std::string(v ? v : "") + ": choose stop or shift";
    } else if (k == "--kv-keep") {
      if (!value(&v) || (std::strcmp(v, "window") && std::strcmp(v, "full")))
        return "--kv-keep " + std::string(v ? v : "") + ": choose window or full";
      a->cap.kv_policy = std::strcmp(v, "full") ? KvPolicy::ModelWindow : KvPolicy::Full;
    } else if (k == "--n-keep") {
      const auto n = value(&v) ? int_in(v, 0, 1 << 24) : std::nullopt;
      if (!n) return "--n-keep needs a number of positions in [0, 16777216]";
      a->cap.limits.n_keep = *n;
    } else if (k == "--ctx" || k == "--kv-sink" || k == "--kv-window") {
      if (!value(&v)) return k + " needs a number";
      char* end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (*v == 0 || *end != 0 || n < 0 || n > (1 << 24))
        return k + " " + v + " is not a number in [0, 16777216]";
      (k == "--ctx"       ? a->cap.limits.n_ctx
       : k == "--kv-sink" ? a->cap.limits.sink
                          : a->cap.limits.window) = int(n);
    } else if (k == "--look-at") {
      const auto n = value(&v) ? int_in(v, 0, 1 << 24) : std::nullopt;
      if (!n) return "--look-at needs a position in [0, 16777216]";
      a->cap.look_at_pos = *n;
    } else if (k == "--cache-quality") {
      const auto n = value(&v) ? int_in(v, 1, 100000) : std::nullopt;
      if (!n) return "--cache-quality needs a number of steps in [1, 100000]";
      a->cap.quality_steps = *n;
    } else if (k == "--backend") {
      if (!value(&v)) return "--backend needs auto, cpu or cuda";
      a->cap.backend = v;
    } else {
      return "unknown option '" + k + "' (see kvscope --help)";
    }
  }
  return "";
}

const char* kUsage =
    "usage: kvscope [options]              the desktop app\n"
    "       kvscope --screenshot OUT.png [options]  the app drawn offscreen (no display needed)\n"
    "       kvscope --replay RUN.kvs [options]  play a recorded run (no model)\n"
    "       kvscope generate|record|export|bench|bench-render ...\n"
    "options: --model NAME|PATH (smollm2-135m, gemma3-270m or a .gguf)\n"
    "         --backend auto|cpu|cuda  --prompt-file F  --steps N\n"
    "         --kv-type T, --kv-type-k T, --kv-type-v T (f32, f16, q8_0, q4_0)\n"
    "         --ctx N  --ctx-full stop|shift  --n-keep K  --kv-sink S --kv-window W\n"
    "         --kv-keep window|full (the KV cache; the engine checks them)\n"
    "         --kv-error (measure each K/V row's quantization error, color the blocks by it)\n"
    "         --mode cache|nocache  --camera top|side|front|3/4|follow (or a list: top,3/4)\n"
    "         --layer L  --head H|mean|max  --all-layers  --no-sink  --size WxH\n"
    "         --scene-only (screenshot without the panels)\n"
    "         --highlight POS (screenshot: show that token as if pointed at)\n"
    "         --compare-modes (screenshot: --steps N with the cache, then without)\n"
    "         --compare-interleaved (screenshot: the same, both at once step by step)\n"
    "         --view-step K (screenshot: look at step K through the history)\n"
    "         --sections A,B (screenshot: open only these panel sections)\n"
    "         --max-tokens N  --speed TOK_S|max\n"
    "         --look-at POS (screenshot: the camera slides along the sequence to POS)\n"
    "         --anim-time S (screenshot: S seconds after the last step, default 0.45;\n"
    "           0.3 catches a context shift mid-slide)\n"
    "         --cache-quality N (screenshot: the Cache quality section, this cache against\n"
    "           f16 with the full context over N steps)\n"
    "         --play  --frames N (quit after N frames)  --window-shot OUT.png\n"
    "         --measure N (play N steps flat out, print engine step and frame times)\n"
    "         --ui-nice N (lower the UI thread's priority by N, default 5; 0 = off)\n";

}  // namespace

int run_app(int argc, char** argv) {
  Args args;
  std::string err = parse_args(argc, argv, &args);
  if (err == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!err.empty()) return cli::fail(err);  // one line, exit status 1
  if (args.screenshot) return run_screenshot(args.cap, !args.scene_only);
  return run_gui(args);
}

}  // namespace kvscope::app
