// capture.cpp — the --screenshot path: engine steps -> timeline -> scene -> PNG.
#include "app/capture.h"

#include <cstdio>

#include "app/engine_setup.h"
#include "app/window.h"
#include "render/gl.h"
#include "render/offscreen.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

Status run_steps(Session& session, const PromptSpec& prompt, int steps, Timeline* timeline) {
  KV_TRY(session.reset(prompt));
  Event reset{Event::Kind::Reset, timeline->run() + 1};
  reset.prompt_text = prompt.text;
  reset.prompt_chat = prompt.chat;
  reset.mode = session.mode();
  timeline->apply(reset);
  for (int i = 0; i < steps && !session.done(); ++i) {
    auto tr = session.step();
    if (!tr.ok()) return tr.error();
    Event e{Event::Kind::Step, reset.run};
    e.trace = std::make_shared<const StepTrace>(std::move(tr.value()));
    timeline->apply(e);
  }
  return Status::Ok();
}

render::Scene capture_scene(const Timeline& tl, const ViewOptions& view, double since_step,
                            render::CameraPreset preset, int width, int height) {
  AnimClock clock;
  clock.since_step = since_step;
  clock.time = since_step;
  render::Scene s = build_scene(tl, view, clock);
  render::Camera cam;
  cam.set_aspect(float(width) / float(height));
  cam.set_content(render::scene_bounds(s), s.head.position);
  cam.set_preset(preset, /*instant=*/true);
  s.camera = cam.view();
  return s;
}

Expected<std::vector<uint8_t>> render_offscreen(render::Renderer& r, const render::Scene& scene,
                                                int width, int height) {
  render::OffscreenTarget target;
  if (render::Result res = render::OffscreenTarget::create(width, height, 4, &target); !res.ok())
    return make_error(res.error);
  target.bind();
  r.draw(scene, width, height);
  std::vector<uint8_t> rgba;
  render::Result res = target.read_rgba(&rgba);
  render::OffscreenTarget::bind_default();
  if (!res.ok()) return make_error(res.error);
  return rgba;
}

int run_screenshot(const CaptureOptions& opts) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "kvscope: %s\n", msg.c_str());
    return 1;
  };
  if (opts.out_path.empty())
    return fail("--screenshot needs an output path, e.g. --screenshot out.png");
  if (opts.steps < 1 || opts.steps > 100000) return fail("--steps must be in [1, 100000]");
  PromptSpec prompt;
  if (!opts.prompt_file.empty()) {
    auto p = read_prompt_file(opts.prompt_file);
    if (!p.ok()) return fail(p.error().message);
    prompt = p.value();
  } else {
    prompt = load_prompts().front().spec;
  }
  WindowOptions wo;
  wo.visible = false;
  wo.width = 64;
  wo.height = 64;
  auto window = GlWindow::create(wo);
  if (!window.ok()) return fail(window.error().message);

  EngineOptions eo;
  eo.model_path = opts.model_path;
  eo.backend = opts.backend;
  eo.mode = opts.mode;
  eo.max_tokens = opts.steps + 1;
  auto engine = open_engine(eo);
  if (!engine.ok()) return fail(engine.error().message);
  EngineHandle& eng = engine.value();
  Timeline tl;
  if (Status st = run_steps(*eng.session, prompt, opts.steps, &tl); !st.ok())
    return fail(st.message());

  render::RendererOptions ro;
  ro.shader_dir = render::find_shader_dir(executable_dir());
  std::unique_ptr<render::Renderer> renderer;
  if (render::Result r = render::Renderer::create(ro, &renderer); !r.ok()) return fail(r.error);
  render::Scene scene =
      capture_scene(tl, opts.view, opts.since_step, opts.camera, opts.width, opts.height);
  auto rgba = render_offscreen(*renderer, scene, opts.width, opts.height);
  if (!rgba.ok()) return fail(rgba.error().message);
  if (render::Result r = render::write_png(opts.out_path, opts.width, opts.height, rgba.value());
      !r.ok())
    return fail(r.error);
  const StepTrace* last = tl.last();
  std::printf("kvscope: wrote %s (%dx%d, %d steps, seq_len %d, mode %s, camera %s)\n",
              opts.out_path.c_str(), opts.width, opts.height, int(tl.steps().size()),
              last ? last->seq_len : 0, cache_mode_name(eng.session->mode()),
              render::camera_preset_name(opts.camera));
  return 0;
}

}  // namespace kvscope::app
