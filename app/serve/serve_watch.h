// serve_watch.h — `kvscope serve` inside the app: the same HTTP server (serve_server.h) on
// the app's model, with an observer on its engine thread that turns every step into the
// Serving view's snapshots (app/core/serving_build.h). Real clients' requests join the
// continuous batch and the view shows what they do to the pool, step by step.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "app/core/engine_setup.h"
#include "app/core/serving_run.h"
#include "app/serve/serve_server.h"

namespace kvscope::serve {

class WatchedServer {
 public:
  // Opens the model and backend `engine` names, a scheduler with `sched`, and the server
  // on `host`:`port` (0: a free one). Errors: the model, the pool, the address.
  static Expected<std::unique_ptr<WatchedServer>> start(const app::EngineOptions& engine,
                                                        const SchedulerConfig& sched,
                                                        ServeServerConfig server);
  ~WatchedServer();  // stops the server (requests in flight are cancelled)

  // The newest snapshot (never null).
  std::shared_ptr<const app::ServingSnapshot> snapshot() const;
  int port() const { return server_->port(); }
  const std::string& host() const { return server_->host(); }
  std::string model_id() const { return server_->ids().front(); }
  EngineSnapshot engine_state() const { return server_->engine().snapshot(); }
  // A one-line notice from opening the engine (a GPU fallback), or "".
  const std::string& notice() const { return notice_; }

 private:
  class Watch;
  WatchedServer() = default;
  std::shared_ptr<Model> model_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Watch> watch_;
  std::unique_ptr<ServeServer> server_;
  std::string notice_;
};

}  // namespace kvscope::serve
