// test_serve_watch.cpp — the Serving view's Serve switch (app/serve/serve_watch.h): the
// OpenAI-compatible endpoint on the default model, real HTTP clients (cpp-httplib), and the
// snapshots its observer builds, as the view would draw them:
//   - a streamed completion: while it streams, a Running lane whose ids open with the
//     prompt's tokens and Used tiles in the pool; once done, the lane is Finished, its
//     generated tokens' text is the response's text, and no tile is Used;
//   - a client that disconnects mid-stream: its lane ends Cancelled and the pool holds no
//     Used tile; a sequence a stop string ended shows Finished, its blocks back (both
//     end between steps);
//   - two clients at once: two lanes Running in the same step.
#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "app/serve/serve_watch.h"
#include "engine/bootstrap/bootstrap.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace std::chrono_literals;

namespace {

const char* kPrompt = "The capital of France is";

std::unique_ptr<serve::WatchedServer> start_server() {
  EngineOptions eo;
  eo.model_path = KVSCOPE_DEFAULT_MODEL;
  eo.backend = "cpu";
  eo.threads = 2;
  SchedulerConfig sc;
  sc.block_size = 16;
  sc.pool_blocks = 32;
  sc.context = 256;
  sc.max_batch_tokens = 128;
  sc.max_seqs = 4;
  serve::ServeServerConfig srv;
  srv.port = 0;
  auto w = serve::WatchedServer::start(eo, sc, srv);
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().message);
  return w.ok() ? std::move(w).value() : nullptr;
}

int used_tiles(const ServingSnapshot& s) {
  int n = 0;
  for (const PoolTile& t : s.tiles) n += t.state == TileState::Used;
  return n;
}

const Lane* lane_of(const ServingSnapshot& s, int seq) {
  for (const Lane& l : s.lanes)
    if (l.seq == seq) return &l;
  return nullptr;
}

// Polls the server's snapshots until `done` holds for one (true) or `timeout` passes.
bool wait_for(const serve::WatchedServer& w,
              const std::function<bool(const ServingSnapshot&)>& done,
              std::chrono::seconds timeout = 60s) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done(*w.snapshot())) return true;
    std::this_thread::sleep_for(20ms);
  }
  return done(*w.snapshot());
}

// A streamed completion's server-sent events, fed in pieces as they arrive: the text of
// every chunk, and whether [DONE] came.
struct SseReader {
  std::string buf, text;
  bool done = false;
  int chunks = 0;
  void feed(const char* data, size_t n) {
    buf.append(data, n);
    for (size_t nl; (nl = buf.find("\n\n")) != std::string::npos;) {
      const std::string event = buf.substr(0, nl);
      buf.erase(0, nl + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string data = event.substr(6);
      if (data == "[DONE]") {
        done = true;
        continue;
      }
      const auto j = nlohmann::json::parse(data, nullptr, false);
      if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
      text += j["choices"][0].value("text", std::string());
      ++chunks;
    }
  }
};

httplib::Request stream_request(const std::string& prompt, int max_tokens) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = nlohmann::json{
      {"prompt", prompt},
      {"max_tokens", max_tokens},
      {"temperature", 0},
      {"stream",
       true}}.dump();
  return req;
}

#define MODEL_OR_FAIL()                                       \
  ASSERT_TRUE(std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) \
      << "default model " << KVSCOPE_DEFAULT_MODEL << " absent: run scripts/fetch_model.sh"

TEST(ServeWatch, AStreamedCompletionIsALaneFromPromptToFinish) {
  MODEL_OR_FAIL();
  auto model = load_model(KVSCOPE_DEFAULT_MODEL);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const Tokenizer& tok = (*model)->tokenizer();
  auto prompt_ids = tokenize_prompt(**model, PromptSpec{kPrompt, false, false});
  ASSERT_TRUE(prompt_ids.ok());
  auto w = start_server();
  ASSERT_TRUE(w);
  EXPECT_EQ(used_tiles(*w->snapshot()), 0);

  httplib::Client cl("127.0.0.1", w->port());
  cl.set_read_timeout(120, 0);
  SseReader sse;
  int seen_running = 0;
  httplib::Request req = stream_request(kPrompt, 40);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.feed(data, n);
    // While it streams: the lane runs, opens with the prompt, and holds blocks.
    auto s = w->snapshot();
    const Lane* l = lane_of(*s, 0);
    if (l && l->state == LaneState::Running) {
      ++seen_running;
      EXPECT_GE(l->ids.size(), prompt_ids->size());
      EXPECT_TRUE(std::equal(prompt_ids->begin(), prompt_ids->end(), l->ids.begin()))
          << "step " << s->step << ": the lane does not open with the prompt's tokens";
      EXPECT_EQ(l->prompt_tokens, int(prompt_ids->size()));
      EXPECT_GT(used_tiles(*s), 0) << "step " << s->step;
      EXPECT_FALSE(l->table.empty());
    }
    return true;
  };
  auto res = cl.send(req);
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_TRUE(sse.done) << "no data: [DONE]";
  EXPECT_GT(seen_running, 0) << "no snapshot showed the lane running while it streamed";

  // Done: the lane finished, its tokens are the response, the pool holds nothing.
  ASSERT_TRUE(wait_for(*w, [](const ServingSnapshot& s) {
    const Lane* l = lane_of(s, 0);
    return l && l->state == LaneState::Finished && used_tiles(s) == 0;
  })) << "the lane did not end Finished with every block back";
  auto s = w->snapshot();
  const Lane& l = *lane_of(*s, 0);
  ASSERT_EQ(l.ids.size(), l.pieces.size());
  ASSERT_GT(int(l.ids.size()), l.prompt_tokens);
  std::string text;
  for (size_t i = size_t(l.prompt_tokens); i < l.ids.size(); ++i) {
    // The end-of-text token that ends a sequence is not part of OpenAI's text.
    if (i + 1 == l.ids.size() && tok.is_eog(l.ids[i])) break;
    text += tok.token_bytes(l.ids[i]);
  }
  std::printf("served %d tokens in %d chunks: '%s' (stop: %s)\n",
              int(l.ids.size()) - l.prompt_tokens, sse.chunks, sse.text.c_str(), l.stop.c_str());
  EXPECT_EQ(text, sse.text);
  EXPECT_LE(int(l.ids.size()) - l.prompt_tokens, 40);
  EXPECT_TRUE(l.table.empty());
  EXPECT_EQ(s->history.back().used, 0);
}

TEST(ServeWatch, AClientThatDisconnectsLeavesACancelledLaneAndNoUsedTile) {
  MODEL_OR_FAIL();
  auto w = start_server();
  ASSERT_TRUE(w);
  httplib::Client cl("127.0.0.1", w->port());
  cl.set_read_timeout(120, 0);
  SseReader sse;
  httplib::Request req = stream_request(kPrompt, 200);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    sse.feed(data, n);
    return sse.chunks < 3;  // hang up after three tokens
  };
  auto res = cl.send(req);
  EXPECT_FALSE(res) << "the client ended the stream itself";
  EXPECT_GE(sse.chunks, 3);
  ASSERT_TRUE(wait_for(*w,
                       [](const ServingSnapshot& s) {
                         const Lane* l = lane_of(s, 0);
                         return l && l->state == LaneState::Cancelled && used_tiles(s) == 0;
                       }))
      << "after the client left, the lane is "
      << (lane_of(*w->snapshot(), 0) ? lane_state_name(lane_of(*w->snapshot(), 0)->state) : "gone")
      << " and " << used_tiles(*w->snapshot()) << " tiles are used";
  auto s = w->snapshot();
  const Lane& l = *lane_of(*s, 0);
  std::printf("cancelled after %d tokens (stop: %s)\n", int(l.ids.size()) - l.prompt_tokens,
              l.stop.c_str());
  EXPECT_LT(int(l.ids.size()) - l.prompt_tokens, 200);
  EXPECT_EQ(s->history.back().used, 0);
}

// A stop string ends the sequence on the engine thread after the step that produced it (the
// scheduler knows no stop strings): with nothing else running no step follows, and the view
// must still show the lane ended and its blocks back.
TEST(ServeWatch, AStopStringEndsTheLaneAndFreesItsBlocks) {
  MODEL_OR_FAIL();
  auto w = start_server();
  ASSERT_TRUE(w);
  httplib::Client cl("127.0.0.1", w->port());
  cl.set_read_timeout(120, 0);
  // Greedy, this prompt goes on " Paris.\n\nThe answer is": stop at the first newline.
  const std::string body = nlohmann::json{
      {"prompt", kPrompt},
      {"max_tokens", 40},
      {"temperature", 0},
      {"stop", "\n"}}.dump();
  auto res = cl.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  const auto j = nlohmann::json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << res->body;
  ASSERT_TRUE(wait_for(*w, [](const ServingSnapshot& s) {
    const Lane* l = lane_of(s, 0);
    return l && l->state == LaneState::Finished && used_tiles(s) == 0;
  })) << "the lane a stop string ended is not Finished with its blocks back in the view";
  auto s = w->snapshot();
  const Lane& l = *lane_of(*s, 0);
  std::printf("stop string: '%s' after %d tokens, lane %s\n",
              j["choices"][0]["text"].get<std::string>().c_str(),
              int(l.ids.size()) - l.prompt_tokens, lane_state_name(l.state));
  EXPECT_LT(int(l.ids.size()) - l.prompt_tokens, 40);
  EXPECT_EQ(l.stop, "stop_string");
  EXPECT_EQ(s->history.back().used, 0);
}

TEST(ServeWatch, TwoClientsRunInTheSameStep) {
  MODEL_OR_FAIL();
  auto w = start_server();
  ASSERT_TRUE(w);
  std::atomic<int> max_running{0};
  std::atomic<bool> stop_watch{false};
  // Watches every snapshot for a step with two Running lanes.
  std::thread watcher([&] {
    while (!stop_watch.load()) {
      auto s = w->snapshot();
      int running = 0;
      for (const Lane& l : s->lanes) running += l.state == LaneState::Running;
      if (running > max_running.load()) max_running.store(running);
      std::this_thread::sleep_for(2ms);
    }
  });
  auto client = [&](const std::string& prompt, std::string* text, int* status) {
    httplib::Client cl("127.0.0.1", w->port());
    cl.set_read_timeout(120, 0);
    SseReader sse;
    httplib::Request req = stream_request(prompt, 16);
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      sse.feed(data, n);
      return true;
    };
    auto res = cl.send(req);
    *status = res ? res->status : -1;
    *text = sse.text;
  };
  std::string a, b;
  int sa = 0, sb = 0;
  std::thread ta(client, std::string(kPrompt), &a, &sa);
  std::thread tb(client, std::string("Once upon a time, a small fox"), &b, &sb);
  ta.join();
  tb.join();
  ASSERT_TRUE(wait_for(*w, [](const ServingSnapshot& s) {
    int finished = 0;
    for (const Lane& l : s.lanes) finished += l.state == LaneState::Finished;
    return finished == 2 && used_tiles(s) == 0;
  })) << "both lanes did not finish with every block back";
  stop_watch.store(true);
  watcher.join();
  EXPECT_EQ(sa, 200);
  EXPECT_EQ(sb, 200);
  auto s = w->snapshot();
  // Every step's running count is in the history, so no step is missed between polls.
  int max_hist = 0;
  for (const ServingPoint& p : s->history) max_hist = std::max(max_hist, p.running);
  std::printf("two clients: '%s' / '%s'; at most %d running in one step (%d seen polling)\n",
              a.c_str(), b.c_str(), max_hist, max_running.load());
  EXPECT_EQ(max_hist, 2) << "the two requests never ran in the same step";
  EXPECT_EQ(s->lanes.size(), 2u);
}

}  // namespace
