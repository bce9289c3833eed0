// serving_capture.cpp — see serving_capture.h.
#include "app/ui/serving_capture.h"

#include <imgui.h>
#include <imgui_impl_opengl3.h>

#include <algorithm>
#include <cstdio>

#include "app/core/serving_record.h"
#include "app/options/options.h"
#include "app/ui/app_frame.h"
#include "app/ui/ui_state.h"
#include "app/ui/window.h"
#include "render/gl.h"
#include "render/offscreen.h"

namespace kvscope::app {

Expected<AppShotResult> capture_serving(render::Renderer& r, UiState& ui, ServingUi& s,
                                        const AppShot& shot) {
  if (shot.width < 16 || shot.height < 16 || shot.width > 8192 || shot.height > 8192)
    return make_error("capture: size ", shot.width, "x", shot.height, " out of range [16, 8192]");
  auto target_or = render::OffscreenTarget::create(shot.width, shot.height, 4);
  if (!target_or.ok()) return target_or.error();
  render::OffscreenTarget& target = *target_or;
  ImGuiContext* prev = ImGui::GetCurrentContext();
  ImGuiContext* ctx = ImGui::CreateContext();
  ImGui::SetCurrentContext(ctx);
  setup_imgui_style(1.0f);
  if (!ImGui_ImplOpenGL3_Init("#version 330 core")) {
    ImGui::DestroyContext(ctx);
    ImGui::SetCurrentContext(prev);
    return make_error("capture: the ImGui OpenGL backend could not start");
  }
  ui.serving = true;
  ui.engine_ready = true;
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
      draw_serving_ui(ui, s);
    } else {
      ui.layout = UiLayout{};
      ui.layout.view = {0, 0, float(shot.width), float(shot.height)};
    }
    // The animation clock as if `since_step` seconds passed since the newest step.
    ServingFrame sf = serving_frame(ui, s, shot.since_step, 0.0f);
    sf.clock = AnimClock{shot.since_step, false, shot.since_step};
    s.view.update(sf, ViewInput{});
    if (shot.panels) serving_overlay(ui, s, false);
    ImGui::Render();
    target.bind();
    render::clear_framebuffer(shot.width, shot.height, 0.06f, 0.065f, 0.08f);
    s.view.draw(r, shot.width, shot.height, 1.0f);
    if (shot.panels) ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  }
  Expected<std::vector<uint8_t>> rgba = target.read_rgba();
  render::OffscreenTarget::bind_default();
  ImGui_ImplOpenGL3_Shutdown();
  ImGui::DestroyContext(ctx);
  ImGui::SetCurrentContext(prev);
  if (!rgba.ok()) return rgba.error();
  out.rgba = std::move(rgba).value();
  out.layout = ui.layout;
  out.view = to_viewport(ui.layout.view, 1.0f);
  out.scene = s.view.scene();
  return out;
}

int run_serving_screenshot(const CaptureOptions& opts, const ServingSettings& settings,
                           bool panels) {
  auto fail = [](const std::string& msg) { return cli::fail(msg); };
  if (opts.out_path.empty())
    return fail("--screenshot needs an output path, e.g. --screenshot out.png");
  auto gl = OffscreenContext::create();
  if (!gl.ok()) return fail(gl.error().message);

  UiState ui;
  ui.prompts = load_prompts();
  if (!opts.prompt_file.empty()) {  // --prompt-file: the first request's prompt, as in the window
    auto p = read_prompt_file(opts.prompt_file);
    if (!p.ok()) return fail(p.error().message);
    ui.prompts.insert(ui.prompts.begin(), {"file", p.value()});
  }
  ui.engine_options = engine_options(opts, CacheMode::Cache, settings.max_tokens);
  ui.serving_ui = std::make_shared<ServingUi>();
  ServingUi& s = *ui.serving_ui;
  s.settings = settings;
  const int target = opts.steps_given ? opts.steps : 24;
  if (!opts.replay_path.empty()) {
    // The last snapshot recorded at or before step `target` (every step when not given).
    if (Status st = serving_open_replay(s, opts.replay_path); !st.ok()) return fail(st.message());
    for (int i = 1; i < s.replay->steps(); ++i) {
      auto next = s.replay->snapshot(i);
      if (!next.ok()) return fail(next.error().message);
      if (opts.steps_given && next.value()->step > target) break;
      s.snap = std::move(next).value();
      s.replay_index = i;
    }
  } else {
    serving_start(ui, s, false);
    s.run->wait_until(target);
    serving_sync(s, 0.0);
  }
  s.playing = false;
  if (!s.snap || !s.snap->error.empty())
    return fail(s.snap ? s.snap->error : std::string("serving: no snapshot"));

  render::RendererOptions ro;
  ro.shader_dir = render::find_shader_dir(executable_dir());
  auto renderer = render::Renderer::create(ro);
  if (!renderer.ok()) return fail(renderer.error().message);
  AppShot shot;
  shot.width = opts.width;
  shot.height = opts.height;
  shot.since_step = opts.since_step;
  shot.panels = panels;
  auto img = capture_serving(*renderer.value(), ui, s, shot);
  if (!img.ok()) return fail(img.error().message);
  for (size_t i = 3; i < img.value().rgba.size(); i += 4) img.value().rgba[i] = 255;
  if (Status st = render::write_png(opts.out_path, opts.width, opts.height, img.value().rgba);
      !st.ok())
    return fail(st.message());
  const ServingSnapshot& snap = *s.snap;
  const ServingPoint* p = snap.history.empty() ? nullptr : &snap.history.back();
  std::printf("kvscope: wrote %s\n", opts.out_path.c_str());
  std::printf(
      "kvscope: serving step %d: %d sequences, blocks %d used, %d cached, %d free of %d; "
      "%d preemptions, %d copies on write; %s\n",
      snap.step, int(snap.lanes.size()), p ? p->used : 0, p ? p->cached : 0,
      p ? p->free : snap.n_blocks, snap.n_blocks, snap.totals.preemptions, snap.totals.cow_copies,
      gl.value()->description().c_str());
  if (s.run) s.run.reset();
  return 0;
}

}  // namespace kvscope::app
