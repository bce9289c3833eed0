// app_capture.cpp — offscreen frames of the whole app, and the --screenshot command.
#include "app/ui/app_capture.h"

#include <imgui.h>
#include <imgui_impl_opengl3.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "app/options/capture_options.h"
#include "app/options/options.h"
#include "app/ui/app_frame.h"
#include "app/core/controller.h"
#include "app/core/replay_source.h"
#include "app/core/run_driver.h"
#include "app/scene/scene_view.h"
#include "app/ui/window.h"
#include "render/gl.h"
#include "render/offscreen.h"

namespace kvscope::app {

ModelFacts model_facts(const EngineHandle& h) {
  return facts_of(*h.session);
}

namespace {

// An ImGui context of its own for one capture, restoring the caller's afterwards.
class ScopedImGui {
 public:
  ScopedImGui() : prev_(ImGui::GetCurrentContext()), ctx_(ImGui::CreateContext()) {
    ImGui::SetCurrentContext(ctx_);
    setup_imgui_style(1.0f);
    ok_ = ImGui_ImplOpenGL3_Init("#version 330 core");
  }
  ~ScopedImGui() {
    if (ok_) ImGui_ImplOpenGL3_Shutdown();
    ImGui::DestroyContext(ctx_);
    ImGui::SetCurrentContext(prev_);
  }
  bool ok() const { return ok_; }

 private:
  ImGuiContext* prev_;
  ImGuiContext* ctx_;
  bool ok_ = false;
};

}  // namespace

Expected<AppShotResult> capture_app(render::Renderer& r, UiState& ui, const Timeline& tl,
                                    const AppShot& shot) {
  if (shot.width < 16 || shot.height < 16 || shot.width > 8192 || shot.height > 8192)
    return make_error("capture: size ", shot.width, "x", shot.height, " out of range [16, 8192]");
  Expected<render::OffscreenTarget> target_or =
      render::OffscreenTarget::create(shot.width, shot.height, 4);
  if (!target_or.ok()) return target_or.error();
  render::OffscreenTarget& target = *target_or;
  ScopedImGui imgui;
  if (!imgui.ok()) return make_error("capture: the ImGui OpenGL backend could not start");

  ControllerState cs;
  cs.finished = tl.finished();
  cs.steps = int(tl.steps().size());
  ui.engine_ready = true;
  ui.preset = shot.preset;
  SceneView view;
  AppShotResult out;
  const int frames = std::max(shot.frames, 0) + 1;
  for (int f = 0; f < frames; ++f) {
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = ImVec2(float(shot.width), float(shot.height));
    io.DisplayFramebufferScale = ImVec2(1.0f, 1.0f);
    io.DeltaTime = 1.0f / 60.0f;
    ImGui_ImplOpenGL3_NewFrame();
    ImGui::NewFrame();
    if (shot.panels) {
      draw_frame_ui(ui, nullptr, cs, tl, ShownRange{view.shown_first(), view.shown_last()});
    } else {
      ui.layout = UiLayout{};
      ui.layout.view = {0, 0, float(shot.width), float(shot.height)};
    }
    ViewFrame vf;
    vf.timeline = &tl;
    vf.view = scene_options(ui);
    vf.view.hovered_pos = ui.hovered_pos;  // a token to show as if pointed at (--highlight)
    vf.clock.since_step = shot.since_step;
    vf.clock.time = shot.since_step;
    vf.preset = shot.preset;
    vf.preset_changed = f == 0;
    vf.rect = ui.layout.view;
    vf.dt = 0;  // no transition: the preset's framing at once
    if (f > 0) vf.look_at_pos = shot.look_at_pos;
    view.update(vf, ViewInput{});
    ImGui::Render();
    target.bind();
    render::clear_framebuffer(shot.width, shot.height, 0.06f, 0.065f, 0.08f);
    view.draw(r, shot.width, shot.height, 1.0f);
    if (shot.panels) ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  }
  Expected<std::vector<uint8_t>> rgba = target.read_rgba();
  if (!rgba.ok()) return rgba.error();
  out.rgba = std::move(rgba).value();
  render::OffscreenTarget::bind_default();
  out.layout = ui.layout;
  out.view = to_viewport(ui.layout.view, 1.0f);
  out.scene = view.scene();
  return out;
}

std::string free_view_png_name(const std::string& dir) {
  namespace fs = std::filesystem;
  for (int i = 1; i < 100000; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "kvscope-view-%03d.png", i);
    std::error_code ec;
    if (!fs::exists(fs::path(dir) / name, ec)) return name;
  }
  return "";
}

Expected<std::string> export_view_png_to(render::Renderer& r, const render::Scene& scene,
                                         int width, int height, const std::string& path) {
  namespace fs = std::filesystem;
  auto px = render_offscreen(r, scene, width, height);
  if (!px.ok()) return px.error();
  if (Status st = render::write_png(path, width, height, px.value()); !st.ok())
    return st.error();
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  return ec ? path : abs.string();
}

Expected<std::string> export_view_png(render::Renderer& r, const render::Scene& scene, int width,
                                      int height, const std::string& dir) {
  const std::string name = free_view_png_name(dir);
  if (name.empty()) return make_error("no free kvscope-view-NNN.png name left in '", dir, "'");
  return export_view_png_to(r, scene, width, height,
                            (std::filesystem::path(dir) / name).string());
}

namespace {

// The prompt a screenshot runs: --prompt-file's, else the first of prompts/.
Expected<PromptSpec> screenshot_prompt(const CaptureOptions& opts) {
  if (opts.prompt_file.empty()) return load_prompts().front().spec;
  return read_prompt_file(opts.prompt_file);
}

// What a screenshot's run produced: the timeline, the model's facts, the prompt (a
// recording's own) and the engine's one-line notice (a GPU fallback).
struct ShotRun {
  ModelFacts facts;
  PromptSpec prompt;
  std::string notice;
};

// A recording played into `tl`, without a model.
Expected<ShotRun> replay_into(const CaptureOptions& opts, PromptSpec prompt, Timeline& tl) {
  auto rep = open_replay(opts.replay_path);
  if (!rep.ok()) return rep.error();
  ShotRun r;
  r.facts = rep.value()->facts();
  DriveOptions d;
  d.steps = opts.steps_given ? opts.steps : int(kRunMaxPositions);
  d.timeline = &tl;
  if (auto end = drive_run(*rep.value(), prompt, d); !end.ok()) return end.error();
  r.prompt = rep.value()->prompt();
  return r;
}

// The real engine run into `tl` (compare modes as the app runs them), with the history
// spool the app keeps, so --view-step reads old steps back.
Expected<ShotRun> run_into(const CaptureOptions& opts, PromptSpec prompt, Timeline& tl) {
  const EngineOptions eo = engine_options(opts, opts.mode, opts.steps);
  auto engine = open_engine(eo);
  if (!engine.ok()) return engine.error();
  EngineHandle& eng = engine.value();
  ShotRun r;
  r.facts = model_facts(eng);
  r.prompt = prompt;
  r.notice = eng.notice;
  RunMeta meta;
  meta.producer = "kvscope";
  meta.model = r.facts;
  meta.prompt = prompt;
  meta.mode = eng.session->mode();
  meta.sampler = eng.session->sampler();
  meta.max_tokens = eo.max_tokens;
  auto spool = RunFile::create_spool(default_spool_dir(), meta, 0);
  auto src = make_session_source(std::move(eng.session), r.facts);
  DriveOptions d;
  d.steps = opts.steps;
  d.timeline = &tl;
  if (spool.ok()) d.record = spool.value();
  if (!opts.compare) {
    if (auto end = drive_run(*src, prompt, d); !end.ok()) return end.error();
    return r;
  }
  if (spool.ok())
    d.next_record = [&meta]() -> std::shared_ptr<RunFile> {
      auto sp2 = RunFile::create_spool(default_spool_dir(), meta, 0);
      return sp2.ok() ? sp2.value() : nullptr;
    };
  if (auto end = drive_compare(*src, prompt, opts.compare_interleaved, d); !end.ok())
    return end.error();
  return r;
}

// The UI state a screenshot draws with: the command line's view, camera and sections.
void screenshot_ui(UiState& ui, const CaptureOptions& opts, const ShotRun& run,
                   const Timeline& tl) {
  ui.prompts = load_prompts();
  if (!opts.prompt_file.empty() || !opts.replay_path.empty())
    ui.prompts.insert(ui.prompts.begin(),
                      {opts.replay_path.empty() ? "file" : "recorded", run.prompt});
  ui.facts = run.facts;
  ui.solo_sections = opts.sections;
  ui.rss_bytes = process_resident_bytes();
  ui.replay = !opts.replay_path.empty();
  ui.replay_path = opts.replay_path;
  ui.run_kv = run_kv_choice(ui.facts.kv_types, opts.replay_path.empty() ? opts.limits : KvLimits{},
                            opts.replay_path.empty() ? opts.kv_block : 0);
  // What the Cache quality section opens.
  ui.engine_options = engine_options(opts, ui.engine_options.mode, ui.engine_options.max_tokens);
  ui.view = opts.view;
  if (ui.view.layer == kMiddleLayer) ui.view.layer = ui.facts.n_layer / 2;
  ui.preset = opts.camera;
  if (opts.compare) {  // the Controls section shows how the comparison was run
    ui.compare_steps = std::clamp(opts.steps, 4, 256);
    ui.compare_interleaved = opts.compare_interleaved;
  }
  ui.mode = tl.mode();
  ui.hovered_pos = opts.view.hovered_pos;
  add_notice(ui, run.notice);
}

// --cache-quality: the comparison run to its end before the picture, and one line about it.
Status run_quality(UiState& ui, const CaptureOptions& opts, const PromptSpec& prompt) {
  if (!opts.replay_path.empty()) return make_error("--cache-quality needs a model, not a recording");
  ui.quality_kv = ui.run_kv;
  ui.quality_steps = opts.quality_steps;
  ui.quality->start(quality_spec(ui, prompt));
  ui.quality->wait();
  QualitySnapshot q = ui.quality->snapshot();
  if (!q.error.empty()) return make_error("cache quality: ", q.error);
  const int n = int(q.points.size());
  std::printf("kvscope: cache quality: %s vs f16, %d steps, mean KL %.4g nats, top-1 %d/%d\n",
              q.candidate.c_str(), n, q.mean_kl, q.agreements, n);
  if (opts.sections.empty()) ui.solo_sections = "Cache quality";
  return Status::Ok();
}

// out.png -> out-top.png, out-34.png, ... when several cameras are asked for.
std::string shot_path(const std::string& out, render::CameraPreset preset, bool several) {
  if (!several) return out;
  std::string tag = render::camera_preset_name(preset);
  tag.erase(std::remove(tag.begin(), tag.end(), '/'), tag.end());
  size_t dot = out.rfind('.');
  size_t slash = out.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = out.size();
  return out.substr(0, dot) + "-" + tag + out.substr(dot);
}

}  // namespace

int run_screenshot(const CaptureOptions& opts, bool panels) {
  auto fail = [](const std::string& msg) { return cli::fail(msg); };
  if (opts.out_path.empty())
    return fail("--screenshot needs an output path, e.g. --screenshot out.png");
  if (opts.steps < 1 || opts.steps > cli::kMaxCaptureSteps)  // checked by the parser too
    return fail("--steps: " + std::to_string(opts.steps) + " is outside 1.." +
                std::to_string(cli::kMaxCaptureSteps));
  auto prompt = screenshot_prompt(opts);
  if (!prompt.ok()) return fail(prompt.error().message);
  auto gl = OffscreenContext::create();
  if (!gl.ok()) return fail(gl.error().message);

  Timeline tl;
  auto run = opts.replay_path.empty() ? run_into(opts, *prompt, tl) : replay_into(opts, *prompt, tl);
  if (!run.ok()) return fail(run.error().message);
  if (opts.view_step > 0) tl.scrub_to(opts.view_step);

  render::RendererOptions ro;
  ro.shader_dir = render::find_shader_dir(executable_dir());
  Expected<std::unique_ptr<render::Renderer>> renderer_or = render::Renderer::create(ro);
  if (!renderer_or.ok()) return fail(renderer_or.error().message);
  std::unique_ptr<render::Renderer> renderer = std::move(renderer_or).value();

  UiState ui;
  screenshot_ui(ui, opts, *run, tl);
  if (opts.quality_steps > 0)
    if (Status st = run_quality(ui, opts, run->prompt); !st.ok()) return fail(st.message());
  std::vector<render::CameraPreset> presets{opts.camera};
  presets.insert(presets.end(), opts.more_cameras.begin(), opts.more_cameras.end());
  for (render::CameraPreset preset : presets) {
    const std::string path = shot_path(opts.out_path, preset, presets.size() > 1);
    AppShot shot;
    shot.width = opts.width;
    shot.height = opts.height;
    shot.preset = preset;
    shot.since_step = opts.since_step;
    shot.panels = panels;
    shot.look_at_pos = opts.look_at_pos;
    auto img = capture_app(*renderer, ui, tl, shot);
    if (!img.ok()) return fail(img.error().message);
    // A screenshot is opaque: the panels' blending leaves the framebuffer's alpha below 1
    // under translucent widgets, and image viewers would let the page show through there.
    for (size_t i = 3; i < img.value().rgba.size(); i += 4) img.value().rgba[i] = 255;
    if (Status st = render::write_png(path, opts.width, opts.height, img.value().rgba); !st.ok())
      return fail(st.message());
    std::printf("kvscope: wrote %s (camera %s)\n", path.c_str(),
                render::camera_preset_name(preset));
  }
  const StepTrace* last = tl.last();
  std::printf("kvscope: %dx%d, %d steps, seq_len %d, mode %s, %s\n", opts.width, opts.height,
              int(tl.steps().size()), last ? last->seq_len : 0,
              cache_mode_name(tl.mode()), gl.value()->description().c_str());
  return 0;
}

}  // namespace kvscope::app
