// serving_run.cpp — the Serving view's worker: one Scheduler at a time on its own thread.
//
// The worker owns the model, the backend and the scheduler; the UI thread only sets
// command fields under `mu` and reads the newest snapshot (an immutable shared_ptr, swapped
// under `snap_mu`). Commands take effect between two steps: the step in flight finishes,
// then a pending start() replaces the run, then play/pause/step/speed decide whether the
// next step runs and when. wait_until() raises a step target that runs even while paused.
#include "app/core/serving_run.h"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <optional>
#include <random>

#include "app/core/serving_build.h"
#include "app/core/serving_record.h"
#include "engine/bootstrap/bootstrap.h"

namespace kvscope::app {

Expected<std::vector<int>> arrival_steps(const std::string& spec, int n, uint64_t seed) {
  std::vector<int> at(size_t(std::max(n, 0)), 1);
  if (spec == "all") return at;
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  char* end = nullptr;
  const double v = arg.empty() ? 0 : std::strtod(arg.c_str(), &end);
  const bool number = !arg.empty() && end && *end == '\0' && std::isfinite(v);
  if (kind == "every" && number && v >= 1 && v <= 1e6 && v == std::floor(v)) {
    for (int i = 0; i < n; ++i) at[size_t(i)] = 1 + i * int(v);
    return at;
  }
  if (kind == "poisson" && number && v > 0 && v <= 1e6) {
    std::mt19937_64 rng(seed);
    std::exponential_distribution<double> gap(v);
    double t = 0;
    for (int i = 0; i < n; ++i) {
      if (i > 0) t += gap(rng);
      at[size_t(i)] = 1 + int(std::min(t, 1e9));
    }
    return at;
  }
  return make_error("--arrival: '", spec,
                    "' (choose all, every:N with N >= 1, or poisson:RATE with RATE > 0 per step)");
}

const char* lane_state_name(LaneState s) {
  switch (s) {
    case LaneState::Waiting:
      return "waiting";
    case LaneState::Running:
      return "running";
    case LaneState::Preempted:
      return "preempted";
    case LaneState::Finished:
      return "finished";
    case LaneState::Cancelled:
      return "cancelled";
    case LaneState::Failed:
      return "failed";
  }
  return "?";
}

struct ServingRun::Impl {
  using Clock = std::chrono::steady_clock;
  EngineOptions engine;

  // Commands (under mu).
  std::mutex mu;
  std::condition_variable cv;
  std::optional<ServingConfig> pending;  // a start() not applied yet
  bool pending_play = false;
  uint64_t pending_run = 0;
  bool playing = false;
  int steps = 0;        // single steps asked for while paused
  int step_target = 0;  // wait_until(): run until this step even while paused
  float speed = 0;      // steps per second; <= 0 flat out
  bool quit = false;
  uint64_t runs = 0;  // start() calls so far (the newest run's id)

  // The newest snapshot (under snap_mu); snap_cv wakes wait_until().
  mutable std::mutex snap_mu;
  std::condition_variable snap_cv;
  std::shared_ptr<const ServingSnapshot> snap = std::make_shared<ServingSnapshot>();

  // Worker only.
  std::shared_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  std::shared_ptr<Model> draft;  // speculation by a draft model: loaded once per path
  std::unique_ptr<Scheduler> sched;  // null: no run (none started, or it failed)
  std::unique_ptr<ServingBuilder> builder;
  std::unique_ptr<ServingRecorder> recorder;  // the run's file, when it is recorded
  bool finished = true;  // the run is done or stopped on an error: nothing to step
  Clock::time_point last_step{};

  std::thread worker;

  // `playing` is read and the snapshot swapped under `mu` (then `snap_mu`, always in that
  // order), so a play() or pause() between the two cannot be overwritten by a stale flag.
  void publish(std::shared_ptr<ServingSnapshot> s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      s->playing = playing;
      std::lock_guard<std::mutex> snap_lock(snap_mu);
      snap = std::move(s);
    }
    snap_cv.notify_all();
  }
  // play()/pause(): the flag, and the snapshot shows it at once (a copy when it changes).
  void set_playing(bool on) {
    {
      std::lock_guard<std::mutex> lock(mu);
      playing = on;
      if (!on) steps = 0;
      std::lock_guard<std::mutex> snap_lock(snap_mu);
      if (snap->playing != on) {
        auto s = std::make_shared<ServingSnapshot>(*snap);
        s->playing = on;
        snap = std::move(s);
      }
    }
    cv.notify_all();
    snap_cv.notify_all();
  }
  std::shared_ptr<const ServingSnapshot> current() const {
    std::lock_guard<std::mutex> lock(snap_mu);
    return snap;
  }
  // The previous snapshot with `message` as its error (the run stopped or failed to start).
  void fail(uint64_t run, const std::string& message) {
    auto s = std::make_shared<ServingSnapshot>(*current());
    s->run = run;
    s->error = message;
    s->done = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      playing = false;
    }
    builder.reset();
    sched.reset();
    finished = true;
    end_recording();
    publish(std::move(s));
  }

  // The recording's END record; a recorder that stopped on an error wrote what it could.
  void end_recording() {
    if (!recorder) return;
    (void)recorder->finish();
    recorder.reset();
  }

  Status begin_recording(const std::string& path, const ServingSnapshot& first) {
    ServingMeta meta;
    meta.producer = std::string("kvscope ") + KVSCOPE_VERSION;
    const ModelConfig& c = model->config();
    meta.model.name = c.name;
    meta.model.arch = c.arch;
    meta.model.backend = backend->name();
    meta.model.file_name = std::filesystem::path(model->path()).filename().string();
    meta.model.file_bytes = model->file().file_size();
    meta.model.n_layer = c.n_layer;
    meta.model.n_head = c.n_head;
    meta.model.n_head_kv = c.n_head_kv;
    meta.model.head_dim = c.head_dim;
    meta.model.n_embd = c.n_embd;
    meta.model.n_vocab = c.n_vocab;
    meta.model.n_ctx = c.n_ctx;
    auto r = ServingRecorder::create(path, meta, first);
    if (!r.ok()) return make_error("record: ", r.error().message);
    recorder = std::move(r).value();
    return Status::Ok();
  }

  Status open_engine_once() {
    if (model && backend) return Status::Ok();
    auto m = load_model(engine.model_path);
    if (!m.ok()) return m.error();
    std::string note;
    auto b = make_backend(engine.backend, **m, engine.threads, &note);
    if (!b.ok()) return b.error();
    model = std::move(*m);
    backend = std::move(*b);
    return Status::Ok();
  }

  // Tokenizes the workload and queues its requests on a new scheduler.
  Status begin(const ServingConfig& cfg, uint64_t run) {
    end_recording();
    builder.reset();
    sched.reset();
    const ServingWorkload& w = cfg.workload;
    if (w.prompts.empty()) return make_error("workload: no prompts");
    if (w.max_tokens < 1) return make_error("workload: max tokens ", w.max_tokens, " (at least 1)");
    KV_TRY(open_engine_once());
    auto arrivals = arrival_steps(w.arrival, int(w.prompts.size()), w.seed);
    if (!arrivals.ok()) return arrivals.error();
    SchedulerConfig sc = cfg.scheduler;
    sc.attention = true;
    std::unique_ptr<Backend> draft_backend;
    if (sc.speculation.kind == DraftKind::Model) {  // every sequence drafts with it
      if (!draft || draft->path() != sc.speculation.draft_path) {
        draft.reset();
        if (sc.speculation.draft_path.empty()) return make_error("draft: no model file named");
        auto d = load_model(sc.speculation.draft_path);
        if (!d.ok()) return make_error("draft: ", d.error().message);
        draft = std::move(*d);
      }
      auto be = make_backend(engine.backend, *draft, engine.threads, nullptr);
      if (!be.ok()) return make_error("draft: ", be.error().message);
      draft_backend = std::move(*be);
    }
    auto s = Scheduler::create(model, *backend, sc, sc.speculation.kind == DraftKind::Model ? draft : nullptr,
                               std::move(draft_backend));
    if (!s.ok()) return s.error();
    const Tokenizer& tok = model->tokenizer();
    std::vector<int32_t> prefix;
    if (!w.shared_prefix.empty()) {
      auto p = tokenize_prompt(*model, PromptSpec{w.shared_prefix, false, false});
      if (!p.ok()) return make_error("shared prefix: ", p.error().message);
      prefix = std::move(*p);
    }
    std::vector<ServingRequest> reqs;
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      auto ids = tokenize_prompt(*model, w.prompts[i]);
      if (!ids.ok()) return make_error("prompt ", i, ": ", ids.error().message);
      // The prefix's tokens then the prompt's (its BOS dropped): identical prefix blocks.
      std::vector<int32_t> toks = prefix;
      size_t from = 0;
      if (!prefix.empty() && tok.add_bos() && !ids->empty() && ids->front() == tok.bos_id())
        from = 1;
      toks.insert(toks.end(), ids->begin() + long(from), ids->end());
      Request r;
      r.prompt = toks;
      r.max_tokens = w.max_tokens;
      r.sampler = w.sampler;
      r.sampler.seed = w.seed + i;  // each request its own stream
      r.arrival_step = (*arrivals)[i];
      r.n = w.n;
      r.beams = w.beams;
      r.length_penalty = w.length_penalty;
      auto id = (*s)->add(std::move(r));
      if (!id.ok()) return make_error("prompt ", i, ": ", id.error().message);
      reqs.push_back({*id, w.n, (*arrivals)[i], std::move(toks)});
    }
    sched = std::move(*s);
    builder = std::make_unique<ServingBuilder>(*sched, cfg, run, std::move(reqs));
    finished = false;
    std::shared_ptr<ServingSnapshot> first = builder->initial();
    if (!cfg.record_path.empty()) KV_TRY(begin_recording(cfg.record_path, *first));
    publish(std::move(first));
    return Status::Ok();
  }

  void do_step() {
    const auto t0 = Clock::now();
    last_step = t0;
    auto st = sched->step();
    const auto t1 = Clock::now();
    const uint64_t run = current()->run;
    if (!st.ok()) return fail(run, "step: " + st.error().message);
    auto s = builder->after_step(*st, t0, t1);
    if (recorder)
      if (Status r = recorder->append(*s); !r.ok()) {
        s->error = "recording stopped: " + r.message();
        end_recording();
      }
    if (s->done) {
      finished = true;
      end_recording();
      std::lock_guard<std::mutex> lock(mu);
      playing = false;
    }
    publish(std::move(s));
  }

  void run_loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (quit) return;
      if (pending) {
        ServingConfig cfg = std::move(*pending);
        pending.reset();
        const uint64_t run = pending_run;
        playing = pending_play;
        lock.unlock();
        if (Status st = begin(cfg, run); !st.ok()) fail(run, st.message());
        lock.lock();
        continue;
      }
      const bool forced = !finished && (steps > 0 || step_target > current()->step);
      const bool paced = !finished && playing;
      if (!forced && !paced) {
        cv.wait(lock);
        continue;
      }
      if (!forced && speed > 0) {  // playing at a pace: wait for the next step's time
        const auto due = last_step + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(1.0 / speed));
        if (Clock::now() < due) {
          cv.wait_until(lock, due);
          continue;
        }
      }
      if (steps > 0 && !playing) --steps;
      lock.unlock();
      do_step();
      lock.lock();
    }
  }
};

ServingRun::ServingRun(EngineOptions engine) : impl_(std::make_unique<Impl>()) {
  impl_->engine = std::move(engine);
  impl_->worker = std::thread([this] { impl_->run_loop(); });
}

ServingRun::~ServingRun() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->quit = true;
    impl_->pending.reset();
  }
  impl_->cv.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
  impl_->end_recording();  // a run dropped mid-way still leaves a whole file
  impl_->snap_cv.notify_all();
}

void ServingRun::start(ServingConfig cfg, bool play) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->pending = std::move(cfg);
    impl_->pending_play = play;
    impl_->pending_run = ++impl_->runs;
    impl_->steps = 0;
    impl_->step_target = 0;
  }
  impl_->cv.notify_all();
}

void ServingRun::play() {
  impl_->set_playing(true);
}

void ServingRun::pause() {
  impl_->set_playing(false);
}

void ServingRun::step() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->playing) impl_->steps = std::min(impl_->steps + 1, 64);
  }
  impl_->cv.notify_all();
}

void ServingRun::set_speed(float steps_per_s) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->speed = std::isfinite(steps_per_s) ? steps_per_s : 0.0f;
  }
  impl_->cv.notify_all();
}

std::shared_ptr<const ServingSnapshot> ServingRun::snapshot() const {
  return impl_->current();
}

void ServingRun::wait_until(int step, double timeout_s) {
  uint64_t run = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->step_target = std::max(impl_->step_target, step);
    run = impl_->runs;
  }
  if (run == 0) return;  // nothing started: no step will come
  impl_->cv.notify_all();
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, timeout_s)));
  std::unique_lock<std::mutex> lock(impl_->snap_mu);
  impl_->snap_cv.wait_until(lock, until, [&] {
    const ServingSnapshot& s = *impl_->snap;
    return s.run == run && (s.step >= step || s.done || !s.error.empty());
  });
}

const Lane* ServingSnapshot::lane(int seq) const {
  auto it = std::lower_bound(lanes.begin(), lanes.end(), seq,
                             [](const Lane& l, int id) { return l.seq < id; });
  return it != lanes.end() && it->seq == seq ? &*it : nullptr;
}

}  // namespace kvscope::app
