// serve_command.cpp — `kvscope serve`: an OpenAI-compatible HTTP endpoint (cpp-httplib)
// whose requests join the Scheduler's continuous batch.
//
// Threads: httplib's pool runs the handlers; they parse and check a request
// (serve_api.h), hand it to the one engine thread (serve_engine.h) and relay its channel's
// events to the client, as server-sent events with `stream: true`, else as one JSON body
// once the request is done. A non-streamed body is sent chunked, with a space (JSON
// whitespace) every half second until it is ready: a failed write is how a handler learns
// that its client went away, for streamed and non-streamed requests alike, and it then
// cancels the request (its blocks go back to the pool). A signal thread waits for SIGINT
// and SIGTERM: new requests get 503, those in flight have --shutdown-grace seconds to
// finish, the rest are cancelled with an error event, then the server stops and the
// command returns 0.
#include "app/serve/serve_command.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <httplib.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "app/options/engine_options.h"
#include "app/options/options.h"
#include "app/options/scheduler_options.h"
#include "app/serve/serve_engine.h"
#include "engine/bootstrap/bootstrap.h"
#include "engine/utf8.h"

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

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  res.set_content(error_json(e), "application/json");
}

// What one response writes as its request's events arrive.
struct Relay {
  std::shared_ptr<Channel> ch;
  ApiRequest req;
  std::string id;
  int64_t created = 0;
  std::vector<ServeEvent> events;    // popped, not written yet
  std::vector<bool> started;         // streamed: the choice's first chunk was written
  std::vector<ApiChoice> choices;    // not streamed: collected
  bool finished = false;             // the last bytes were written
  std::atomic<int>* open = nullptr;  // responses not finished (shutdown waits on them)
};

// Serialized events for a stream; *done when the stream ends.
std::string sse(Relay& r, bool* done) {
  std::string out;
  auto data = [&](const std::string& j) { out += "data: " + j + "\n\n"; };
  for (ServeEvent& e : r.events) {
    switch (e.kind) {
      case ServeEvent::Kind::Text:
      case ServeEvent::Kind::Finish: {
        const bool first = !r.started[size_t(e.index)];
        r.started[size_t(e.index)] = true;
        data(chunk_json(r.req, r.id, r.created, e.index, e.text, &e.logprobs, e.finish_reason,
                        first));
        break;
      }
      case ServeEvent::Kind::Done:
        if (r.req.include_usage) data(usage_chunk_json(r.req, r.id, r.created, e.usage));
        data("[DONE]");
        *done = true;
        break;
      case ServeEvent::Kind::Error:
        data(error_json(e.error));
        data("[DONE]");
        *done = true;
        break;
      case ServeEvent::Kind::Accepted:
        break;
    }
  }
  r.events.clear();
  return out;
}

// The whole body once Done (or an error) arrived; "" before.
std::string collect(Relay& r, bool* done) {
  std::string out;
  for (ServeEvent& e : r.events) {
    if (e.kind == ServeEvent::Kind::Text) {
      ApiChoice& c = r.choices[size_t(e.index)];
      c.text += e.text;
      for (auto& t : e.logprobs) c.logprobs.push_back(std::move(t));
    } else if (e.kind == ServeEvent::Kind::Finish) {
      r.choices[size_t(e.index)].finish_reason = e.finish_reason;
    } else if (e.kind == ServeEvent::Kind::Done) {
      out = completion_json(r.req, r.id, r.created, r.choices, e.usage);
      *done = true;
    } else if (e.kind == ServeEvent::Kind::Error) {
      out = error_json(e.error);  // the status line (200) is already sent
      *done = true;
    }
  }
  r.events.clear();
  return out;
}

std::string request_id(bool chat) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%llx%06llx", chat ? "chatcmpl" : "cmpl",
                (unsigned long long)std::time(nullptr), (unsigned long long)counter.fetch_add(1));
  return buf;
}

void handle_completion(ServeEngine& engine, const ApiLimits& limits, std::atomic<int>& open,
                       bool chat, const httplib::Request& req, httplib::Response& res) {
  size_t bad = 0;
  if (!utf8_valid(req.body, &bad))
    return send_error(res, ApiError{400,
                                    "the request body is not valid UTF-8 (at byte offset " +
                                        std::to_string(bad) + ")",
                                    "invalid_request_error", "", "invalid_utf8"});
  auto relay = std::make_shared<Relay>();
  if (auto e = parse_api_request(req.body, chat, limits, &relay->req)) return send_error(res, *e);
  ApiError err;
  relay->ch = engine.submit(relay->req, &err);
  if (!relay->ch) return send_error(res, err);
  // The engine's first answer: Accepted, or Error (a prompt it cannot take, shutdown).
  while (relay->events.empty()) relay->ch->pop(relay->events, 100ms);
  if (relay->events.front().kind == ServeEvent::Kind::Error)
    return send_error(res, relay->events.front().error);
  relay->events.erase(relay->events.begin());
  relay->id = request_id(chat);
  relay->created = int64_t(std::time(nullptr));
  relay->started.assign(size_t(relay->req.n), false);
  relay->choices.resize(size_t(relay->req.n));
  relay->open = &open;
  open.fetch_add(1);
  const bool stream = relay->req.stream;
  auto provider = [relay, stream](size_t, httplib::DataSink& sink) {
    Relay& r = *relay;
    if (r.events.empty()) r.ch->pop(r.events, stream ? 200ms : 500ms);
    bool done = false;
    std::string out = stream ? sse(r, &done) : collect(r, &done);
    if (out.empty() && !done && !stream) out = " ";  // whitespace: is the client still there?
    if (!out.empty() && !sink.write(out.data(), out.size())) {
      r.ch->cancel();
      return false;
    }
    if (done) {
      r.finished = true;
      sink.done();
    }
    return true;
  };
  auto releaser = [relay](bool success) {
    if (!success || !relay->finished) relay->ch->cancel();
    relay->open->fetch_sub(1);
  };
  if (stream) res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(stream ? "text/event-stream" : "application/json", provider,
                                   releaser);
}

std::string health_json(const ServeEngine& engine, const std::string& model, bool stopping) {
  const EngineSnapshot s = engine.snapshot();
  nlohmann::json j = {{"status", stopping ? "shutting_down" : "ok"},
                      {"model", model},
                      {"pool",
                       {{"used", s.pool.used},
                        {"free", s.pool.free},
                        {"cached", s.pool.cached},
                        {"total", s.pool.total},
                        {"block_size", s.block_size}}},
                      {"pool_check", s.pool_check},
                      {"running", s.running},
                      {"waiting", s.waiting},
                      {"in_flight", s.in_flight},
                      {"requests", s.requests},
                      {"cancelled", s.cancelled},
                      {"steps", s.steps}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Names the "model" field may give: the file's stem, and its built-in name if it is one.
std::vector<std::string> model_ids(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> ids{fs::path(path).stem().string()};
  for (const BuiltinModel& b : builtin_models())
    if (fs::path(path).filename() == b.file) ids.push_back(b.name);
  return ids;
}

void set_routes(httplib::Server& svr, ServeEngine& engine, const ApiLimits& limits,
                std::atomic<int>& open, const std::atomic<bool>& stopping, int max_body_kib) {
  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(health_json(engine, limits.model_ids.front(), stopping.load()),
                    "application/json");
  });
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    static const int64_t created = int64_t(std::time(nullptr));
    res.set_content(models_json({limits.model_ids.front()}, created), "application/json");
  });
  svr.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    handle_completion(engine, limits, open, false, req, res);
  });
  svr.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    handle_completion(engine, limits, open, true, req, res);
  });
  // httplib's own refusals (no route, a body over the limit, ...) in OpenAI's shape.
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body_kib](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.status = res.status;
        if (res.status == 413) {
          e.message = "the request body is larger than this server's limit of " +
                      std::to_string(max_body_kib) + " KiB (--max-body-kib)";
          e.code = "request_too_large";
        } else if (res.status == 404) {
          e.message = "no route " + req.method + " " + req.path +
                      " (routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                      "GET /health)";
          e.code = "not_found";
        } else {
          e.message =
              "HTTP status " + std::to_string(res.status) + " for " + req.method + " " + req.path;
        }
        if (res.status >= 500) e.type = "server_error";
        res.set_content(error_json(e), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& x) {
          what = x.what();
        } catch (...) {
        }
        send_error(res, ApiError{500, "internal error: " + what, "server_error", "", ""});
      });
}

// Waits for SIGINT/SIGTERM (blocked in every thread) until `quit`; on one, stops taking
// requests, gives those in flight `grace_s` seconds (a second signal cuts it short),
// cancels the rest, lets their responses end and stops the server.
void watch_signals(const sigset_t& set, std::atomic<bool>& quit, std::atomic<bool>& stopping,
                   ServeEngine& engine, httplib::Server& svr, const std::atomic<int>& open,
                   int grace_s) {
  const timespec tick{0, 100 * 1000 * 1000};
  while (!quit.load()) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig != SIGINT && sig != SIGTERM) continue;
    std::fprintf(stderr, "kvscope serve: %s, finishing %d requests in flight (up to %d s)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM", engine.snapshot().in_flight, grace_s);
    stopping.store(true);
    engine.stop_accepting();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
    while (engine.snapshot().in_flight > 0 && std::chrono::steady_clock::now() < until) {
      const int again = sigtimedwait(&set, nullptr, &tick);
      if (again == SIGINT || again == SIGTERM) break;
    }
    engine.shutdown();  // the rest get an error event
    const auto flush_until = std::chrono::steady_clock::now() + 3s;
    while (open.load() > 0 && std::chrono::steady_clock::now() < flush_until)
      std::this_thread::sleep_for(10ms);
    svr.stop();
    return;
  }
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

  ApiLimits limits;
  limits.model_ids = model_ids(*path);
  limits.context = (*sched)->config().context;
  limits.max_n = std::min(64, (*sched)->config().max_seqs);
  const int pool_blocks = (*sched)->pool().n_blocks(), block = (*sched)->config().block_size;
  ServeEngine engine(std::move(*sched), ServeEngineConfig{a.max_queue});

  httplib::Server svr;
  const size_t threads = size_t(a.max_queue) + 8;  // every request in flight has a thread
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(size_t(a.max_body_kib) * 1024);
  svr.set_keep_alive_max_count(1000);
  std::atomic<int> open{0};
  std::atomic<bool> stopping{false}, quit{false};
  set_routes(svr, engine, limits, open, stopping, a.max_body_kib);
  // httplib listens with a backlog of 5 connections not yet accepted
  // (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's library). A burst of new
  // connections beyond it (32 clients at once while the model keeps the CPUs busy) overflows
  // the accept queue: the kernel drops their SYNs or handshake ACKs (SYN cookies under the
  // burst), and about a second later some of those clients are reset before a byte of their
  // request is read (seen with OpenAI's client: 1 run in 8 lost 1 to 11 of 32 streams). The listening socket (the last one httplib made before it bound) listens again
  // with the system's limit, so every request the queue admits can be a new connection.
  socket_t listen_sock = INVALID_SOCKET;
  svr.set_socket_options([&listen_sock](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_sock = sock;
  });
  const int port =
      a.port == 0 ? svr.bind_to_any_port(a.host) : (svr.bind_to_port(a.host, a.port) ? a.port : -1);
  if (port < 0)
    return cli::fail("serve: cannot listen on " + a.host + ":" + std::to_string(a.port) +
                     " (address in use, or not an address of this machine)");
  if (listen_sock == INVALID_SOCKET || ::listen(listen_sock, SOMAXCONN) != 0)
    cli::notice("warning: the listening socket keeps httplib's backlog of 5 connections; a "
                "burst of new connections may see some reset");
  if (a.host != "127.0.0.1" && a.host != "localhost" && a.host != "::1")
    cli::notice("warning: listening on " + a.host + ":" + std::to_string(port) +
                ", beyond this machine; there is no authentication: anyone who can reach it "
                "can use the model");
  engine.start();
  std::thread signals(watch_signals, std::cref(set), std::ref(quit), std::ref(stopping),
                      std::ref(engine), std::ref(svr), std::cref(open), a.grace_s);
  std::printf(
      "kvscope serve: listening on http://%s:%d (model %s, %d KV blocks of %d positions, "
      "context %d)\n",
      a.host.c_str(), port, limits.model_ids.front().c_str(), pool_blocks, block, limits.context);
  std::fflush(stdout);
  const bool listened = svr.listen_after_bind();
  quit.store(true);
  signals.join();
  engine.shutdown();
  if (!listened) return cli::fail("serve: the server stopped listening on its own");
  std::printf("kvscope serve: stopped\n");
  return 0;
}

}  // namespace kvscope::serve
