// capture.cpp — engine steps -> timeline -> settled, framed scene -> offscreen pixels.
#include "app/scene/capture.h"

#include "render/gl.h"
#include "render/offscreen.h"
#include "render/synthetic_scene.h"

namespace kvscope::app {

EngineOptions engine_options(const CaptureOptions& cap, CacheMode mode, int max_tokens) {
  EngineOptions eo;
  eo.model_path = cap.model_path;
  eo.backend = cap.backend;
  eo.mode = mode;
  eo.max_tokens = max_tokens;
  eo.kv_types = cap.kv_types;
  eo.limits = cap.limits;
  eo.kv_policy = cap.kv_policy;
  eo.kv_block = cap.kv_block;
  eo.kv_errors = cap.kv_errors;
  return eo;
}

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
  s.anim.beam_arc = render::preset_beam_arc(preset);
  render::Camera cam;
  cam.set_aspect(float(width) / float(height));
  cam.set_ground(s.grid.height);
  cam.set_content(render::framing_content(s, s.anim.beam_arc));
  cam.set_preset(preset, /*instant=*/true);
  s.camera = cam.view();
  return s;
}

Expected<std::vector<uint8_t>> render_offscreen(render::Renderer& r, const render::Scene& scene,
                                                int width, int height) {
  Expected<render::OffscreenTarget> target = render::OffscreenTarget::create(width, height, 4);
  if (!target.ok()) return target.error();
  target->bind();
  r.draw(scene, width, height);
  Expected<std::vector<uint8_t>> rgba = target->read_rgba();
  render::OffscreenTarget::bind_default();
  return rgba;
}

}  // namespace kvscope::app
