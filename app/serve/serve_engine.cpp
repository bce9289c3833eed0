// serve_engine.cpp — the engine thread of `kvscope serve` (see serve_engine.h).
#include "app/serve/serve_engine.h"

#include <algorithm>
#include <random>

#include "engine/session.h"

namespace kvscope::serve {

void Channel::push(ServeEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

bool Channel::pop(std::vector<ServeEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (events_.empty()) cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > best; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
  return best;
}

size_t stop_find(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  size_t at = std::string::npos;
  for (const std::string& s : stops) {
    const size_t p = text.find(s, from);
    if (p < at) at = p;
  }
  return at;
}

struct ServeEngine::Job {
  struct Choice {
    std::string text;                   // the choice's text so far (held-back bytes included)
    size_t sent = 0;                    // bytes of it sent to the channel
    std::vector<TokenLogprob> pending;  // log-probabilities of tokens not sent yet
    int tokens = 0;
    bool done = false;
  };
  std::shared_ptr<Channel> ch;
  ApiRequest req;
  int first = -1;  // its first sequence id; sample k is first + k
  int prompt_tokens = 0;
  std::vector<Choice> choices;
  int done = 0;
  bool ended = false;
};

ServeEngine::ServeEngine(std::unique_ptr<Scheduler> sched, ServeEngineConfig cfg)
    : sched_(std::move(sched)), cfg_(cfg) {
  snap_.block_size = sched_->config().block_size;
  snap_.pool = sched_->pool().counts();
}

ServeEngine::~ServeEngine() {
  shutdown();
}

void ServeEngine::start() {
  thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<Channel> ServeEngine::submit(ApiRequest req, ApiError* err) {
  auto job = std::make_unique<Job>();
  job->ch = std::make_shared<Channel>();
  job->req = std::move(req);
  std::shared_ptr<Channel> ch = job->ch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !accepting_) {
      *err = ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"};
      return nullptr;
    }
    if (in_flight_.load() >= cfg_.max_queue) {
      *err = ApiError{429,
                      "the server has " + std::to_string(cfg_.max_queue) +
                          " requests in flight (its --max-queue); retry later",
                      "rate_limit_error", "", "queue_full"};
      return nullptr;
    }
    in_flight_.fetch_add(1);
    inbox_.push_back(std::move(job));
  }
  cv_.notify_all();
  return ch;
}

void ServeEngine::stop_accepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

void ServeEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineSnapshot ServeEngine::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineSnapshot s = snap_;
  s.in_flight = in_flight_.load();
  return s;
}

void ServeEngine::publish(bool idle) {
  EngineSnapshot s;
  s.pool = sched_->pool().counts();
  s.block_size = sched_->config().block_size;
  s.steps = uint64_t(sched_->stats().steps);
  s.requests = requests_;
  s.cancelled = cancelled_;
  int running = 0, waiting = 0;
  for (const auto& j : jobs_)
    for (size_t k = 0; k < j->choices.size(); ++k) {
      const SeqState st = sched_->state(j->first + int(k));
      running += st == SeqState::Running;
      waiting += st == SeqState::Waiting || st == SeqState::Pending;
    }
  s.running = running;
  s.waiting = waiting;
  std::lock_guard<std::mutex> lock(mu_);
  if (idle) {
    Status c = sched_->check();
    s.pool_check = c.ok() ? "ok" : c.message();
  } else {
    s.pool_check = snap_.pool_check;
  }
  snap_ = std::move(s);
}

void ServeEngine::loop() {
  for (;;) {
    const bool idle = jobs_.empty() && sched_->idle();
    if (idle) publish(true);
    std::deque<std::unique_ptr<Job>> fresh;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (idle) cv_.wait(lock, [&] { return stopping_ || !inbox_.empty(); });
      if (stopping_) break;
      fresh.swap(inbox_);
    }
    for (auto& j : fresh) {
      admit(*j);
      if (j->first >= 0) {
        jobs_.push_back(std::move(j));
      } else {
        in_flight_.fetch_sub(1);
      }
    }
    // Clients that went away: their sequences leave the batch, their blocks the pool.
    for (auto& j : jobs_) {
      if (j->ended || !j->ch->cancelled()) continue;
      ++cancelled_;
      end_job(*j);
    }
    tell_observer();
    if (!sched_->idle()) {
      auto st = sched_->step();
      if (!st.ok()) {
        fail_all(ApiError{500, "the engine failed: " + st.error().message, "server_error", "", ""});
      } else {
        if (cfg_.observer) cfg_.observer->stepped(*st, *sched_);
        route(*st);
        tell_observer();  // stop strings end sequences after the step
      }
    }
    std::erase_if(jobs_, [](const std::unique_ptr<Job>& j) { return j->ended; });
    publish(false);
  }
  const ApiError bye{503, "the server is shutting down", "server_error", "", "shutting_down"};
  fail_all(bye);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : inbox_) {
    ServeEvent e;
    e.kind = ServeEvent::Kind::Error;
    e.error = bye;
    j->ch->push(std::move(e));
    in_flight_.fetch_sub(1);
  }
  inbox_.clear();
}

void ServeEngine::admit(Job& job) {
  const ApiRequest& q = job.req;
  const Model& model = sched_->model();
  const Tokenizer& tok = model.tokenizer();
  const int ctx = sched_->config().context;
  auto refuse = [&](ApiError e) {
    ServeEvent ev;
    ev.kind = ServeEvent::Kind::Error;
    ev.error = std::move(e);
    job.ch->push(std::move(ev));
  };
  auto bad = [&](std::string param, std::string message, std::string code = "") {
    refuse(ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                    std::move(code)});
  };
  Request r;
  if (!q.prompt_ids.empty()) {
    r.prompt = q.prompt_ids;
  } else {
    PromptSpec spec{q.prompt, false, false};
    if (q.chat) {
      auto text = tok.apply_chat_template(q.messages, true);
      if (!text.ok()) return bad("messages", text.error().message);
      spec = PromptSpec{*text, false, true};
    }
    auto ids = tokenize_prompt(model, spec);
    if (!ids.ok()) return bad(q.chat ? "messages" : "prompt", ids.error().message);
    r.prompt = std::move(*ids);
  }
  const int P = int(r.prompt.size());
  if (P >= ctx)
    return bad(q.chat ? "messages" : "prompt",
               "This model's maximum context length is " + std::to_string(ctx) +
                   " tokens; the prompt has " + std::to_string(P) +
                   " (leave room for at least one generated token)",
               "context_length_exceeded");
  if (q.max_tokens < 0) {
    // Up to the context, or what the pool holds if that is less (--kv-pool-mib).
    const int pool_positions =
        sched_->pool().n_blocks() / sched_->layer_groups().count() * sched_->config().block_size;
    const int room = std::max(1, std::min(ctx, pool_positions) - P);
    r.max_tokens = q.chat ? room : std::min(16, room);
  } else if (P + q.max_tokens > ctx) {
    return bad("max_tokens",
               "This model's maximum context length is " + std::to_string(ctx) +
                   " tokens. However, you requested " + std::to_string(P + q.max_tokens) +
                   " tokens (" + std::to_string(P) + " in the prompt, " +
                   std::to_string(q.max_tokens) + " in the completion)",
               "context_length_exceeded");
  } else {
    r.max_tokens = q.max_tokens;
  }
  r.sampler.temperature = q.temperature;
  r.sampler.top_p = q.top_p;
  r.sampler.seed = q.seed ? *q.seed : std::random_device{}() * 0x100000001ull;
  r.sampler.penalties.presence = q.presence_penalty;
  r.sampler.penalties.frequency = q.frequency_penalty;
  r.sampler.penalties.repeat = q.repetition_penalty;
  r.sampler.penalties.logit_bias = q.logit_bias;
  r.n = q.n;
  r.logprobs = q.logprobs;
  const Request kept = cfg_.observer ? r : Request{};
  auto id = sched_->add(std::move(r));
  if (!id.ok()) return bad("", id.error().message);
  if (cfg_.observer) cfg_.observer->added(*id, kept);
  job.first = *id;
  job.prompt_tokens = P;
  job.choices.resize(size_t(q.n));
  if (by_seq_.size() < size_t(*id + q.n)) by_seq_.resize(size_t(*id + q.n), nullptr);
  for (int k = 0; k < q.n; ++k) by_seq_[size_t(*id + k)] = &job;
  ++requests_;
  ServeEvent ev;
  ev.kind = ServeEvent::Kind::Accepted;
  ev.usage.prompt_tokens = P;
  job.ch->push(std::move(ev));
}

void ServeEngine::route(const BatchStep& st) {
  const Tokenizer& tok = sched_->model().tokenizer();
  for (const StepRow& row : st.rows) {
    if (row.token_id < 0 || size_t(row.seq) >= by_seq_.size() || !by_seq_[size_t(row.seq)])
      continue;
    Job& job = *by_seq_[size_t(row.seq)];
    const int index = row.seq - job.first;
    Job::Choice& c = job.choices[size_t(index)];
    if (c.done) continue;
    ++c.tokens;
    // The end-of-text token that ended the sequence is not part of its text (OpenAI's
    // answers stop before it; `generate` shows it, e.g. <|im_end|>).
    if (sched_->state(row.seq) == SeqState::Finished &&
        sched_->stop_reason(row.seq) == StopReason::Eos)
      continue;
    c.text += row.text;
    if (job.req.logprobs >= 0) {
      auto entry = [&](int32_t id, float lp) {
        const std::string b = tok.token_bytes(id);
        return TokenLogprob{
            logprob_token_text(b), std::vector<uint8_t>(b.begin(), b.end()), lp, {}};
      };
      TokenLogprob t = entry(row.token_id, row.logprob);
      for (const auto& [id, lp] : row.top_logprobs) t.top.push_back(entry(id, lp));
      c.pending.push_back(std::move(t));
    }
    emit(job, index, false);
  }
  for (const SchedEvent& e : st.events) {
    if (e.kind != EventKind::Finish || size_t(e.seq) >= by_seq_.size() || !by_seq_[size_t(e.seq)])
      continue;
    Job& job = *by_seq_[size_t(e.seq)];
    const StopReason r = sched_->stop_reason(e.seq);
    finish_choice(job, e.seq - job.first,
                  r == StopReason::MaxTokens || r == StopReason::ContextFull ? "length" : "stop");
  }
}

// Sends what choice `index` may send: its text up to a stop string (which ends it), or
// all but what could still become one; `final` sends everything.
void ServeEngine::emit(Job& job, int index, bool final) {
  Job::Choice& c = job.choices[size_t(index)];
  const std::vector<std::string>& stops = job.req.stop;
  size_t upto = c.text.size();
  bool stopped = false;
  if (!stops.empty()) {
    const size_t at = stop_find(c.text, c.sent, stops);
    if (at != std::string::npos) {
      upto = at;
      stopped = true;
    } else if (!final) {
      upto -= stop_holdback(c.text.substr(c.sent), stops);
    }
  }
  if (upto > c.sent || (!c.pending.empty() && (upto == c.text.size() || stopped))) {
    ServeEvent ev;
    ev.kind = ServeEvent::Kind::Text;
    ev.index = index;
    ev.text = c.text.substr(c.sent, upto - c.sent);
    ev.logprobs = std::move(c.pending);
    c.pending.clear();
    c.sent = upto;
    job.ch->push(std::move(ev));
  }
  if (!stopped) return;
  const int seq = job.first + index;
  const SeqState s = sched_->state(seq);
  if (s == SeqState::Pending || s == SeqState::Waiting || s == SeqState::Running)
    cancel_seq(seq, EventKind::Finish, "stop_string");  // ends it here: its blocks go back
  c.text.resize(upto);
  c.sent = upto;
  c.done = true;
  ServeEvent ev;
  ev.kind = ServeEvent::Kind::Finish;
  ev.index = index;
  ev.finish_reason = "stop";
  job.ch->push(std::move(ev));
  if (++job.done == int(job.choices.size())) end_job(job);
}

void ServeEngine::finish_choice(Job& job, int index, const std::string& reason) {
  Job::Choice& c = job.choices[size_t(index)];
  if (c.done) return;
  emit(job, index, true);
  if (c.done) return;  // a stop string in the last text
  c.done = true;
  ServeEvent ev;
  ev.kind = ServeEvent::Kind::Finish;
  ev.index = index;
  ev.finish_reason = reason;
  job.ch->push(std::move(ev));
  if (++job.done == int(job.choices.size())) end_job(job);
}

void ServeEngine::cancel_seq(int seq, EventKind kind, const char* detail) {
  if (!sched_->cancel(seq).ok()) return;
  SchedEvent e;
  e.kind = kind;
  e.seq = seq;
  e.detail = detail;
  between_.push_back(e);
}

// Without this a client that leaves while nothing else runs would stay a running lane with
// its blocks in the observer's view: no step follows to show them back in the pool.
void ServeEngine::tell_observer() {
  if (between_.empty()) return;
  if (cfg_.observer) cfg_.observer->changed(between_, *sched_);
  between_.clear();
}

// The job leaves: live sequences are cancelled (a client gone), all are forgotten, and a
// job whose choices all finished gets its Done event.
void ServeEngine::end_job(Job& job) {
  if (job.ended) return;
  int tokens = 0;
  for (size_t k = 0; k < job.choices.size(); ++k) {
    const int seq = job.first + int(k);
    const SeqState s = sched_->state(seq);
    if (s == SeqState::Pending || s == SeqState::Waiting || s == SeqState::Running) cancel_seq(seq);
    (void)sched_->forget(seq);
    by_seq_[size_t(seq)] = nullptr;
    tokens += job.choices[k].tokens;
  }
  if (job.done == int(job.choices.size())) {
    ServeEvent ev;
    ev.kind = ServeEvent::Kind::Done;
    ev.usage = {job.prompt_tokens, tokens};
    job.ch->push(std::move(ev));
  }
  job.ended = true;
  in_flight_.fetch_sub(1);
}

void ServeEngine::fail_all(const ApiError& e) {
  for (auto& j : jobs_) {
    if (j->ended) continue;
    end_job(*j);
    ServeEvent ev;
    ev.kind = ServeEvent::Kind::Error;
    ev.error = e;
    j->ch->push(std::move(ev));
  }
  std::erase_if(jobs_, [](const std::unique_ptr<Job>& j) { return j->ended; });
}

}  // namespace kvscope::serve
