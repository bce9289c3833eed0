// serve_server.h — the HTTP side of `kvscope serve`: the routes (serve_api.h) on a
// cpp-httplib server, its listening thread and the engine thread (serve_engine.h) behind
// them. Used by the command (serve_command.cpp, which adds the signals) and by the app's
// Serve switch in the Serving view, which watches the requests through an observer.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "app/serve/serve_api.h"
#include "app/serve/serve_engine.h"
#include "common/status.h"

namespace httplib {
class Server;
}

namespace kvscope::serve {

struct ServeServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free port (port() says which)
  int max_queue = 64;
  int max_body_kib = 1024;
  std::shared_ptr<ServeObserver> observer;  // optional (serve_engine.h)
};

// Names the "model" field may give: the file's stem, and its built-in name if it is one.
std::vector<std::string> model_ids(const std::string& path);

class ServeServer {
 public:
  // Takes the scheduler (its model and backend must outlive the server), binds the
  // address and starts the engine and the listening thread. An error when it cannot bind.
  static Expected<std::unique_ptr<ServeServer>> start(std::unique_ptr<Scheduler> sched,
                                                      const std::string& model_path,
                                                      ServeServerConfig cfg);
  ~ServeServer();  // stop(0)
  ServeServer(const ServeServer&) = delete;
  ServeServer& operator=(const ServeServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return cfg_.host; }
  const std::vector<std::string>& ids() const { return ids_; }
  int context() const { return context_; }
  const ServeEngine& engine() const { return *engine_; }
  // The listening socket takes the system's backlog, not httplib's 5 (see start()).
  bool wide_backlog() const { return wide_backlog_; }
  // The listening thread ended without stop() (the server failed on its own).
  bool failed() const { return listen_ended_.load() && !stopping_.load(); }
  // New requests get 503; those in flight get `grace_s` seconds (less if `cut_short`
  // returns true), the rest end with an error event; their responses get up to 3 s to
  // finish; then the server stops and its threads are joined. Idempotent.
  void stop(int grace_s, const std::function<bool()>& cut_short = {});

 private:
  ServeServer() = default;
  ServeServerConfig cfg_;
  std::vector<std::string> ids_;
  ApiLimits limits_;  // the routes read it while the server runs
  int context_ = 0;
  int port_ = -1;
  std::unique_ptr<ServeEngine> engine_;
  std::unique_ptr<httplib::Server> svr_;
  std::thread listener_;
  std::atomic<int> open_{0};  // responses not finished
  std::atomic<bool> stopping_{false}, listen_ended_{false};
  bool stopped_ = false;
  bool wide_backlog_ = false;
};

}  // namespace kvscope::serve
