// run_options.cpp — the options of a run and the session they open (see run_options.h).
#include "app/cli/run_options.h"

#include "engine/bootstrap/bootstrap.h"

namespace kvscope::cli {

void add_run_options(CLI::App& app, RunOptions& o) {
  add_prompt_options(app, o.prompt);
  add_mode_option(app, o.mode);
  add_max_tokens_option(app, o.max_tokens, "Tokens to generate");
  add_sampler_options(app, o.sampler);
  add_stop_options(app, o.stop);
  add_engine_options(app, o.engine);
  add_kv_options(app, o.kv);
}

Expected<OpenedRun> open_run(const RunOptions& o) {
  OpenedRun r;
  auto spec = prompt_from_options(o.prompt);
  if (!spec.ok()) return spec.error();
  r.prompt = *spec;
  auto sampler = to_sampler_config(o.sampler);
  if (!sampler.ok()) return sampler.error();
  r.sampler = *sampler;
  KV_TRY(apply_kv_options(o.kv, r.config));
  r.config.mode = mode_from_option(o.mode);
  r.config.max_tokens = o.max_tokens;
  r.config.stop_strings = o.stops;
  r.config.stop_ids = o.stop.stop_ids;
  r.config.min_tokens = o.stop.min_tokens;
  auto session = open_session(o.engine.model, o.engine.backend, o.engine.threads, r.config,
                              &r.notice);
  if (!session.ok()) return session.error();
  r.session = std::move(session).value();
  KV_TRY(penalty_config_check(r.sampler.penalties, r.session->model().config().n_vocab));
  r.session->set_sampler(r.sampler);
  KV_TRY(r.session->reset(r.prompt));
  return r;
}

}  // namespace kvscope::cli
