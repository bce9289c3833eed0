// serve_watch.cpp — see serve_watch.h.
#include "app/serve/serve_watch.h"

#include <chrono>

#include "app/core/serving_build.h"
#include "engine/bootstrap/bootstrap.h"

namespace kvscope::serve {

// The observer: the builder and the newest snapshot. added() and stepped() run on the
// server's engine thread, and so does changed() (requests cancelled between steps);
// snapshot() on the UI thread.
class WatchedServer::Watch final : public ServeObserver {
 public:
  explicit Watch(uint64_t run) : run_(run) {}
  void begin(const Scheduler& s, const app::ServingConfig& cfg) {
    builder_ = std::make_unique<app::ServingBuilder>(s, cfg, run_,
                                                    std::vector<app::ServingRequest>{});
    std::shared_ptr<app::ServingSnapshot> first = builder_->initial();
    first->playing = true;
    std::lock_guard<std::mutex> lock(mu_);
    snap_ = std::move(first);
  }
  void added(int first_seq, const Request& r) override {
    app::ServingRequest q;
    q.first_seq = first_seq;
    q.n = r.n;
    q.arrival_step = r.arrival_step;
    q.prompt = r.prompt;
    builder_->add_request(std::move(q));
  }
  void stepped(const BatchStep& st, const Scheduler&) override {
    const auto t1 = std::chrono::steady_clock::now();
    const auto t0 = t1 - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double, std::milli>(st.ms));
    std::shared_ptr<app::ServingSnapshot> s = builder_->after_step(st, t0, t1);
    s->playing = true;
    std::lock_guard<std::mutex> lock(mu_);
    snap_ = std::move(s);
  }
  void changed(const std::vector<SchedEvent>& events, const Scheduler&) override {
    std::shared_ptr<app::ServingSnapshot> s = builder_->after_change(events);
    s->playing = true;
    std::lock_guard<std::mutex> lock(mu_);
    snap_ = std::move(s);
  }
  std::shared_ptr<const app::ServingSnapshot> snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return snap_;
  }

 private:
  uint64_t run_;
  std::unique_ptr<app::ServingBuilder> builder_;
  mutable std::mutex mu_;
  std::shared_ptr<const app::ServingSnapshot> snap_;
};

Expected<std::unique_ptr<WatchedServer>> WatchedServer::start(const app::EngineOptions& engine,
                                                              const SchedulerConfig& sched,
                                                              ServeServerConfig server) {
  std::unique_ptr<WatchedServer> w(new WatchedServer());
  auto path = resolve_model(engine.model_path);
  if (!path.ok()) return path.error();
  auto model = load_model(*path);
  if (!model.ok()) return model.error();
  w->model_ = *model;
  auto backend = make_backend(engine.backend, *w->model_, engine.threads, &w->notice_);
  if (!backend.ok()) return backend.error();
  w->backend_ = std::move(*backend);
  SchedulerConfig cfg = sched;
  cfg.attention = true;
  auto s = Scheduler::create(w->model_, *w->backend_, cfg);
  if (!s.ok()) return s.error();
  static std::atomic<uint64_t> runs{1u << 20};
  w->watch_ = std::make_shared<Watch>(runs.fetch_add(1));
  app::ServingConfig sc;
  sc.scheduler = cfg;
  w->watch_->begin(**s, sc);  // the scheduler object stays where it is when moved below
  server.observer = w->watch_;
  auto srv = ServeServer::start(std::move(*s), *path, std::move(server));
  if (!srv.ok()) return srv.error();
  w->server_ = std::move(*srv);
  return w;
}

WatchedServer::~WatchedServer() {
  if (server_) server_->stop(0);
}

std::shared_ptr<const app::ServingSnapshot> WatchedServer::snapshot() const {
  return watch_->snapshot();
}

}  // namespace kvscope::serve
