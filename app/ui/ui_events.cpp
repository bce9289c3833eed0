// ui_events.cpp — see ui_events.h.
#include "app/ui/ui_events.h"

#include <filesystem>

namespace kvscope::app {

std::unique_ptr<Controller> start_controller(UiState& ui, const CaptureOptions& cap,
                                             bool autoplay) {
  auto ctl = std::make_unique<Controller>(std::unique_ptr<StepSource>());
  ui.autoplay = autoplay;
  ctl->send(CmdSpeed{ui.speed_max ? kSpeedMax : ui.speed});
  if (!cap.replay_path.empty()) {
    ui.replay_path = cap.replay_path;
    ctl->send(CmdOpenRun{cap.replay_path});
    return ctl;
  }
  const EngineOptions eo = engine_options(cap, ui.mode, ui.max_tokens);
  ui.engine_options = eo;
  ctl->send(CmdLoadModel{eo});
  return ctl;
}

void apply_event(UiState& ui, Controller& ctl, Timeline& tl, const Event& e, double now) {
  switch (e.kind) {
    case Event::Kind::Error:
      ui.error = e.error;
      break;
    case Event::Kind::Notice:
      add_notice(ui, e.error);
      break;
    case Event::Kind::Saved:
      add_notice(ui,
                 "Saved the run (" + format_bytes(e.bytes) + ") to " +
                     std::filesystem::absolute(e.path).string() +
                     (e.error.empty() ? "" : " (" + e.error + ")"),
                 8.0);
      break;
    case Event::Kind::Source:
      if (!e.facts) break;
      ui.facts = *e.facts;
      ui.replay = e.replay;
      if (e.replay) ui.replay_path = e.path;
      ui.engine_ready = true;
      ui.mode = e.mode;
      // The KV memory section compares against this source's own cache settings.
      ui.run_kv =
          run_kv_choice(ui.facts.kv_types, e.replay ? KvLimits{} : ui.engine_options.limits,
                        e.replay ? 0 : ui.engine_options.kv_block);
      ui.whatif_set = false;
      if (ui.view.layer == kMiddleLayer || ui.view.layer >= ui.facts.n_layer)
        ui.view.layer = ui.facts.n_layer / 2;
      if (e.replay || !ui.prompts.empty()) {
        PromptSpec p = e.replay ? PromptSpec{} : ui.prompts[size_t(ui.prompt_index)].spec;
        ctl.send(CmdReset{p, ui.autoplay});
      }
      break;
    case Event::Kind::ModeChanged:
      if (e.run == tl.run() || tl.run() == 0) ui.mode = e.mode;
      break;
    case Event::Kind::Step:
      ui.last_step_time = now;
      break;
    default:
      break;
  }
  tl.apply(e);
}

void sync_frame(UiState& ui, Timeline& tl, double now) {
  if (ui.scrub_request > 0) tl.scrub_to(ui.scrub_request);
  if (ui.scrub_request < 0) tl.follow_live();
  ui.scrub_request = 0;
  if (now - ui.rss_time >= 0.5) {
    ui.rss_bytes = process_resident_bytes();
    ui.rss_time = now;
  }
}

void apply_events(UiState& ui, Controller& ctl, Timeline& tl, double now) {
  for (Event& e : ctl.poll()) apply_event(ui, ctl, tl, e, now);
  sync_frame(ui, tl, now);
}

}  // namespace kvscope::app
