// serve_command.cpp — `kvscope serve`: an OpenAI-compatible HTTP endpoint (cpp-httplib)
// whose requests join the Scheduler's continuous batch.
//
// The routes, the listening thread and the engine thread are ServeServer's
// (serve_server.h). The command's own thread waits for SIGINT and SIGTERM: new requests
// get 503, those in flight have --shutdown-grace seconds to finish, the rest are cancelled
// with an error event, then the server stops and the command returns 0.
#include "app/serve/serve_command.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>

#include "app/options/engine_options.h"
#include "app/options/options.h"
#include "app/options/scheduler_options.h"
#include "app/serve/serve_server.h"
#include "engine/bootstrap/bootstrap.h"

namespace kvscope::serve {
namespace {

using namespace std::chrono_literals;

struct ServeArgs {
  std::string host = "127.0.0.1";
  int port = 8080;
  int max_queue = 64;
  int max_body_kib = 1024;
  int grace_s = 5;
};

// Waits for SIGINT/SIGTERM (blocked in every thread) until the server fails on its own;
// on one, stops the server: new requests get 503, those in flight get `grace_s` seconds
// (a second signal cuts it short), the rest are cancelled. Returns whether a signal came.
bool watch_signals(const sigset_t& set, ServeServer& server, int grace_s) {
  const timespec tick{0, 100 * 1000 * 1000};
  while (!server.failed()) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig != SIGINT && sig != SIGTERM) continue;
    std::fprintf(stderr, "kvscope serve: %s, finishing %d requests in flight (up to %d s)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", server.engine().snapshot().in_flight,
                 grace_s);
    const timespec now{0, 0};
    server.stop(grace_s, [&] {
      const int again = sigtimedwait(&set, nullptr, &now);
      return again == SIGINT || again == SIGTERM;
    });
    return true;
  }
  return false;
}

}  // namespace

int run_serve(int argc, char** argv) {
  CLI::App app{
      "An OpenAI-compatible HTTP endpoint (/v1/completions, /v1/chat/completions): "
      "requests join the continuous batch.",
      "kvscope serve"};
  ServeArgs a;
  cli::EngineArgs engine_args;
  cli::SchedulerOptions sched_opts;
  app.add_option("--host", a.host,
                 "Address to listen on (default 127.0.0.1; any other is reachable from other "
                 "machines, with no authentication)");
  app.add_option("--port", a.port, "Port to listen on (0: a free port, printed at start)")
      ->check(cli::Range(0, 65535));
  app.add_option("--max-queue", a.max_queue,
                 "Requests in flight at once (running or waiting); more get 429")
      ->check(cli::Range(1, 4096));
  app.add_option("--max-body-kib", a.max_body_kib, "Largest request body in KiB; larger: 413")
      ->check(cli::Range(1, 1 << 20));
  app.add_option("--shutdown-grace", a.grace_s,
                 "Seconds requests in flight get to finish after SIGINT/SIGTERM")
      ->check(cli::Range(0, 3600));
  cli::add_engine_options(app, engine_args);
  cli::add_scheduler_options(app, sched_opts);
  if (int rc = cli::parse_options(app, argc, argv); rc >= 0) return rc;
  if (a.host.empty()) return cli::fail("--host: empty (give an address, e.g. 127.0.0.1)");
  KvTypes kv_types;
  if (Status st = cli::parse_kv_type_options(sched_opts.kv, &kv_types); !st.ok())
    return cli::fail(st.message());

  // SIGINT and SIGTERM go to the signal thread alone: blocked here, before any thread
  // (the backend's, httplib's, the engine's) is made. A client gone is a failed write,
  // not SIGPIPE.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto path = resolve_model(engine_args.model);
  if (!path.ok()) return cli::fail(path.error().message);
  auto model = load_model(*path);
  if (!model.ok()) return cli::fail(model.error().message);
  auto cfg = cli::to_scheduler_config(sched_opts, **model);
  if (!cfg.ok()) return cli::fail(cfg.error().message);
  std::string note;
  auto backend = make_backend(engine_args.backend, **model, engine_args.threads, &note);
  if (!backend.ok()) return cli::fail(backend.error().message);
  if (!note.empty()) cli::notice(note);
  auto sched = Scheduler::create(*model, **backend, *cfg);
  if (!sched.ok()) return cli::fail(sched.error().message);

  const int pool_blocks = (*sched)->pool().n_blocks(), block = (*sched)->config().block_size;
  ServeServerConfig sc;
  sc.host = a.host;
  sc.port = a.port;
  sc.max_queue = a.max_queue;
  sc.max_body_kib = a.max_body_kib;
  auto server = ServeServer::start(std::move(*sched), *path, sc);
  if (!server.ok()) return cli::fail(server.error().message);
  ServeServer& srv = **server;
  const int port = srv.port();
  if (!srv.wide_backlog())
    cli::notice("warning: the listening socket keeps httplib's backlog of 5 connections; a "
                "burst of new connections may see some reset");
  if (a.host != "127.0.0.1" && a.host != "localhost" && a.host != "::1")
    cli::notice("warning: listening on " + a.host + ":" + std::to_string(port) +
                ", beyond this machine; there is no authentication: anyone who can reach it "
                "can use the model");
  std::printf(
      "kvscope serve: listening on http://%s:%d (model %s, %d KV blocks of %d positions, "
      "context %d)\n",
      a.host.c_str(), port, srv.ids().front().c_str(), pool_blocks, block, srv.context());
  std::fflush(stdout);
  const bool signalled = watch_signals(set, srv, a.grace_s);
  srv.stop(0);
  if (!signalled) return cli::fail("serve: the server stopped listening on its own");
  std::printf("kvscope serve: stopped\n");
  return 0;
}

}  // namespace kvscope::serve
