// serve_server.cpp — see serve_server.h.
//
// Threads: httplib's pool runs the handlers; they parse and check a request
// (serve_api.h), hand it to the one engine thread (serve_engine.h) and relay its channel's
// events to the client, as server-sent events with `stream: true`, else as one JSON body
// once the request is done. A non-streamed body is sent chunked, with a space (JSON
// whitespace) every half second until it is ready: a failed write is how a handler learns
// that its client went away, for streamed and non-streamed requests alike, and it then
// cancels the request (its blocks go back to the pool).
#include "app/serve/serve_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/bootstrap/bootstrap.h"
#include "engine/utf8.h"

namespace kvscope::serve {
namespace {

using namespace std::chrono_literals;

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


}  // namespace

std::vector<std::string> model_ids(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> ids{fs::path(path).stem().string()};
  for (const BuiltinModel& b : builtin_models())
    if (fs::path(path).filename() == b.file) ids.push_back(b.name);
  return ids;
}


Expected<std::unique_ptr<ServeServer>> ServeServer::start(std::unique_ptr<Scheduler> sched,
                                                          const std::string& model_path,
                                                          ServeServerConfig cfg) {
  std::unique_ptr<ServeServer> s(new ServeServer());
  s->cfg_ = std::move(cfg);
  s->ids_ = model_ids(model_path);
  s->context_ = sched->config().context;
  ApiLimits& limits = s->limits_;
  limits.model_ids = s->ids_;
  limits.context = sched->config().context;
  limits.max_n = std::min(64, sched->config().max_seqs);
  s->engine_ = std::make_unique<ServeEngine>(std::move(sched),
                                             ServeEngineConfig{s->cfg_.max_queue, s->cfg_.observer});
  s->svr_ = std::make_unique<httplib::Server>();
  httplib::Server& svr = *s->svr_;
  const size_t threads = size_t(s->cfg_.max_queue) + 8;  // every request in flight has a thread
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(size_t(s->cfg_.max_body_kib) * 1024);
  svr.set_keep_alive_max_count(1000);
  set_routes(svr, *s->engine_, limits, s->open_, s->stopping_, s->cfg_.max_body_kib);
  // httplib listens with a backlog of 5 connections not yet accepted
  // (CPPHTTPLIB_LISTEN_BACKLOG, compiled into Debian's library). A burst of new
  // connections beyond it (32 clients at once while the model keeps the CPUs busy) overflows
  // the accept queue: the kernel answers the rest with SYN cookies and drops their ACKs, and
  // about a second later some of those clients are reset before a byte of their request is
  // read. The listening socket (the last one httplib made before it bound) listens again
  // with the system's limit, so every request the queue admits can be a new connection.
  socket_t listen_sock = INVALID_SOCKET;
  svr.set_socket_options([&listen_sock](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_sock = sock;
  });
  const std::string& host = s->cfg_.host;
  const int port = s->cfg_.port == 0 ? svr.bind_to_any_port(host)
                                     : (svr.bind_to_port(host, s->cfg_.port) ? s->cfg_.port : -1);
  if (port < 0)
    return make_error("serve: cannot listen on ", host, ":", s->cfg_.port,
                      " (address in use, or not an address of this machine)");
  s->wide_backlog_ = listen_sock != INVALID_SOCKET && ::listen(listen_sock, SOMAXCONN) == 0;
  s->port_ = port;
  s->engine_->start();
  ServeServer* self = s.get();
  s->listener_ = std::thread([self] {
    self->svr_->listen_after_bind();
    self->listen_ended_.store(true);
  });
  return s;
}

void ServeServer::stop(int grace_s, const std::function<bool()>& cut_short) {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true);
  engine_->stop_accepting();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
  while (engine_->snapshot().in_flight > 0 && std::chrono::steady_clock::now() < until) {
    if (cut_short && cut_short()) break;
    std::this_thread::sleep_for(20ms);
  }
  engine_->shutdown();  // the rest get an error event
  const auto flush_until = std::chrono::steady_clock::now() + 3s;
  while (open_.load() > 0 && std::chrono::steady_clock::now() < flush_until)
    std::this_thread::sleep_for(10ms);
  svr_->stop();
  if (listener_.joinable()) listener_.join();
}

ServeServer::~ServeServer() { stop(0); }

}  // namespace kvscope::serve
