// controller.cpp — the worker loop: coalesced commands in, events out, paced steps, one step
// at a time with every pending command applied at each boundary (see controller.h).
#include "app/core/controller.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "app/core/clock.h"
#include "app/core/replay_source.h"

#ifndef KVSCOPE_VERSION
#define KVSCOPE_VERSION "dev"
#endif

namespace kvscope::app {

using Clock = std::chrono::steady_clock;

namespace {

template <class T>
bool is(const Command& c) {
  return std::holds_alternative<T>(c);
}

// Merges `c` into the queue under the rules in controller.h.
void coalesce(std::deque<Command>& q, Command c) {
  auto drop = [&q](auto pred) { q.erase(std::remove_if(q.begin(), q.end(), pred), q.end()); };
  auto transport = [](const Command& x) {
    return is<CmdPlay>(x) || is<CmdPause>(x) || is<CmdStep>(x) || is<CmdStop>(x);
  };
  if (is<CmdReset>(c) || is<CmdCompare>(c)) {
    drop([&](const Command& x) { return transport(x) || is<CmdReset>(x) || is<CmdCompare>(x); });
  } else if (is<CmdLoadModel>(c) || is<CmdOpenRun>(c)) {
    drop([&](const Command& x) {
      return transport(x) || is<CmdReset>(x) || is<CmdCompare>(x) || is<CmdLoadModel>(x) ||
             is<CmdOpenRun>(x);
    });
  } else if (is<CmdPlay>(c) || is<CmdPause>(c)) {
    drop([](const Command& x) { return is<CmdPlay>(x) || is<CmdPause>(x); });
  } else if (is<CmdStop>(c)) {
    drop([&](const Command& x) { return transport(x); });
  } else if (auto* st = std::get_if<CmdStep>(&c)) {
    int queued = 0;
    for (const Command& x : q)
      if (auto* s = std::get_if<CmdStep>(&x)) queued += s->count;
    int add = std::min(st->count, kMaxQueuedSteps - queued);
    if (add <= 0) return;
    if (!q.empty())
      if (auto* tail = std::get_if<CmdStep>(&q.back())) {
        tail->count += add;
        return;
      }
    st->count = add;
  } else if (is<CmdSave>(c)) {
    int saves = 0;
    for (const Command& x : q) saves += is<CmdSave>(x);
    if (saves >= 4)
      q.erase(std::find_if(q.begin(), q.end(), [](const Command& x) { return is<CmdSave>(x); }));
  } else {  // Speed, Mode, Sampler, MaxTokens: the newest value wins
    const size_t kind = c.index();
    drop([kind](const Command& x) { return x.index() == kind; });
  }
  q.push_back(std::move(c));
}

}  // namespace

std::string default_spool_dir() {
  if (const char* d = std::getenv("KVSCOPE_SPOOL_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kvscope";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kvscope";
  return "/var/tmp";
}

Controller::Controller(std::unique_ptr<StepSource> source, ControllerOptions options)
    : source_(std::move(source)), opts_(std::move(options)) {
  if (opts_.spool_dir.empty()) opts_.spool_dir = default_spool_dir();
  a_has_source_ = source_ != nullptr;
  a_replay_ = source_ && source_->is_replay();
  worker_ = std::thread([this] { run(); });
}

Controller::Controller(std::unique_ptr<Session> session, ControllerOptions options)
    : Controller(session ? make_session_source(std::move(session)) : nullptr, std::move(options)) {}

Controller::~Controller() {
  quit_ = true;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.clear();
  }
  cmd_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Controller::send(Command c) {
  if (is<CmdShutdown>(c)) {
    quit_ = true;
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.clear();
  } else {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    coalesce(commands_, std::move(c));
  }
  cmd_cv_.notify_all();
}

size_t Controller::queued() const {
  std::lock_guard<std::mutex> lock(cmd_mu_);
  return commands_.size();
}

std::vector<Event> Controller::poll() {
  std::lock_guard<std::mutex> lock(ev_mu_);
  std::vector<Event> out(std::make_move_iterator(events_.begin()),
                         std::make_move_iterator(events_.end()));
  events_.clear();
  queued_full_.reset();
  return out;
}

bool Controller::has_events() const {
  std::lock_guard<std::mutex> lock(ev_mu_);
  return !events_.empty();
}

std::vector<Event> Controller::wait_events(int timeout_ms) {
  std::unique_lock<std::mutex> lock(ev_mu_);
  ev_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()),
                         std::make_move_iterator(events_.end()));
  events_.clear();
  queued_full_.reset();
  return out;
}

ControllerState Controller::state() const {
  ControllerState s;
  s.playing = a_playing_.load();
  s.busy = a_busy_.load();
  s.loading = a_loading_.load();
  s.finished = a_finished_.load();
  s.has_source = a_has_source_.load();
  s.replay = a_replay_.load();
  s.compare = a_compare_.load();
  s.speed = a_speed_.load();
  s.steps = a_steps_.load();
  s.save_bytes = a_save_bytes_.load();
  if (s.busy) {
    s.computing_step = s.steps + 1;
    s.busy_seconds = std::max<int64_t>(0, now_ns() - a_busy_since_ns_.load()) * 1e-9;
  }
  return s;
}

void Controller::emit(Event e) {
  {
    std::lock_guard<std::mutex> lock(ev_mu_);
    events_.push_back(std::move(e));
  }
  ev_cv_.notify_all();
}

void Controller::emit_step(Event e, std::shared_ptr<StepTrace> full) {
  {
    std::lock_guard<std::mutex> lock(ev_mu_);
    // Still in the queue (poll() lets go of it) and held by nothing else: nobody can be
    // reading it, so its rows can go.
    if (queued_full_ && queued_full_.use_count() == 2)
      queued_full_->attention = std::vector<float>();
    queued_full_ = full->attention.empty() ? nullptr : std::move(full);
    events_.push_back(std::move(e));
  }
  ev_cv_.notify_all();
}

void Controller::emit_error(ErrorOrigin origin, std::string message) {
  Event e{Event::Kind::Error, run_};
  e.origin = origin;
  if (source_) e.mode = source_->mode();
  e.error = std::move(message);
  emit(std::move(e));
}

void Controller::emit_source() {
  Event e{Event::Kind::Source, run_};
  if (source_) {
    e.facts = std::make_shared<const ModelFacts>(source_->facts());
    e.replay = source_->is_replay();
    e.mode = source_->mode();
    if (auto rec = source_->recording()) e.path = rec->name();
  }
  emit(std::move(e));
}

void Controller::publish() {
  a_playing_ = playing_;
  a_finished_ = finished_;
  a_speed_ = speed_;
  a_steps_ = steps_;
  a_compare_ = compare_.phase();
  a_has_source_ = source_ != nullptr;
  a_replay_ = source_ && source_->is_replay();
  const std::shared_ptr<RunFile> file = !source_ || !has_run_  ? nullptr
                                        : source_->is_replay() ? source_->recording()
                                                               : spool_;
  a_save_bytes_ = file ? file->bytes() : 0;
}

bool Controller::can_step() const {
  return source_ && has_run_ && !finished_ && (playing_ || manual_steps_ > 0);
}

bool Controller::start_run(const PromptSpec& prompt, bool autoplay, ComparePhase compare) {
  playing_ = false;
  manual_steps_ = 0;
  if (!source_) {
    emit_error(ErrorOrigin::Reset,
               "no model is loaded: open a model (or the built-in one) or a "
               "recorded run first");
    return false;
  }
  if (Status st = source_->reset(prompt); !st.ok()) {
    emit_error(ErrorOrigin::Reset, st.message());
    return false;
  }
  ++run_;
  steps_ = 0;
  has_run_ = true;
  finished_ = false;
  playing_ = autoplay;
  end_reason_ = FinishReason::Running;
  spool_.reset();
  Event e{Event::Kind::Reset, run_};
  e.prompt_text = source_->prompt().text;
  e.prompt_chat = source_->prompt().chat;
  e.mode = source_->mode();
  e.compare = compare;
  if (source_->is_replay()) {
    e.store = source_->recording();
  } else if (opts_.spool) {
    RunMeta meta;
    meta.producer = std::string("kvscope ") + KVSCOPE_VERSION;
    meta.model = source_->facts();
    meta.prompt = source_->prompt();
    meta.mode = source_->mode();
    meta.sampler = source_->sampler();
    meta.max_tokens = source_->max_tokens();
    meta.attention = opts_.spool_attention;
    auto sp = RunFile::create_spool(opts_.spool_dir, meta, opts_.spool_cap);
    if (sp.ok()) {
      spool_ = std::move(sp.value());
      e.store = spool_;
    } else {
      Event n{Event::Kind::Notice, run_};
      n.error = "history: " + sp.error().message + "; earlier steps cannot be revisited or saved";
      emit(std::move(n));
    }
  }
  emit(std::move(e));
  return true;
}

void Controller::finish_run(FinishReason reason) {
  finished_ = true;
  playing_ = false;
  manual_steps_ = 0;
  end_reason_ = reason;
  Event e{Event::Kind::Finished, run_};
  e.reason = reason;
  emit(std::move(e));
  // A comparison moves on to its next leg when one of its runs ends by itself.
  compare_.finished(reason, steps_);
}

void Controller::set_mode(CacheMode m, ErrorOrigin origin) {
  if (!source_) return;
  if (source_->mode() == m) return;
  if (Status st = source_->set_mode(m); !st.ok()) {
    emit_error(origin, st.message());
    return;
  }
  Event e{Event::Kind::ModeChanged, run_};
  e.mode = source_->mode();
  emit(std::move(e));
}

void Controller::replace_source(std::unique_ptr<StepSource> s) {
  if (source_ && s && !source_->is_replay() && !s->is_replay())
    (void)s->set_sampler(source_->sampler());  // keep the person's sampling settings
  source_ = std::move(s);
  has_run_ = false;
  finished_ = true;
  playing_ = false;
  manual_steps_ = 0;
  steps_ = 0;
  spool_.reset();
  emit_source();
}

void Controller::save(const CmdSave& s) {
  if (!source_ || !has_run_ || s.run != run_) {
    emit_error(ErrorOrigin::Save, has_run_ && s.run != run_
                                      ? "cannot save: a newer run has started since"
                                      : "cannot save: no run yet");
    return;
  }
  RunEnd end{steps_, to_string(finished_ ? end_reason_ : FinishReason::Running)};
  std::shared_ptr<RunFile> file = source_->is_replay() ? source_->recording() : spool_;
  if (!file) {
    emit_error(ErrorOrigin::Save,
               "cannot save: this run's history could not be kept (see the "
               "earlier notice); record it with `kvscope record` instead");
    return;
  }
  if (source_->is_replay()) end = file->end();
  if (Status st = file->save_copy(s.path, end); !st.ok()) {
    emit_error(ErrorOrigin::Save, st.message());
    return;
  }
  Event e{Event::Kind::Saved, run_};
  e.path = s.path;
  e.bytes = file->bytes();
  if (file->attention_dropped())
    e.error = "steps past the history cap were kept without their attention rows";
  emit(std::move(e));
}

// Speed, Mode, Sampler, MaxTokens, KvErrors: the settings (an interleaved comparison's twin
// follows the source's sampling, token limit and K/V error measurement).
void Controller::handle_settings(Command& c) {
  StepSource* twin = compare_.twin();
  if (auto* s = std::get_if<CmdSpeed>(&c)) {
    speed_ = s->tokens_per_s <= kSpeedMax ? kSpeedMax
                                          : std::clamp(s->tokens_per_s, kSpeedMin, kSpeedTop);
  } else if (auto* m = std::get_if<CmdMode>(&c)) {
    compare_.cancel();
    set_mode(m->mode, ErrorOrigin::Mode);
  } else if (auto* sm = std::get_if<CmdSampler>(&c)) {
    if (source_)
      if (Status st = source_->set_sampler(sm->sampler); !st.ok())
        emit_error(ErrorOrigin::Settings, st.message());
    if (twin) (void)twin->set_sampler(sm->sampler);
  } else if (auto* mt = std::get_if<CmdMaxTokens>(&c)) {
    if (source_)
      if (Status st = source_->set_max_tokens(std::max(1, mt->max_tokens)); !st.ok())
        emit_error(ErrorOrigin::Settings, st.message());
    if (twin) (void)twin->set_max_tokens(std::max(1, mt->max_tokens));
  } else if (auto* ke = std::get_if<CmdKvErrors>(&c)) {
    if (source_) source_->set_kv_errors(ke->on);
    if (twin) twin->set_kv_errors(ke->on);
  }
}

void Controller::handle(Command& c) {
  if (auto* r = std::get_if<CmdReset>(&c)) {
    compare_.cancel();
    start_run(r->prompt, r->autoplay, ComparePhase::None);
  } else if (std::holds_alternative<CmdPlay>(c)) {
    playing_ = has_run_ && !finished_;
  } else if (std::holds_alternative<CmdPause>(c)) {
    playing_ = false;
  } else if (auto* st = std::get_if<CmdStep>(&c)) {
    playing_ = false;
    if (has_run_ && !finished_)
      manual_steps_ = std::min(manual_steps_ + st->count, kMaxQueuedSteps);
  } else if (is<CmdSpeed>(c) || is<CmdMode>(c) || is<CmdSampler>(c) || is<CmdMaxTokens>(c) ||
             is<CmdKvErrors>(c)) {
    handle_settings(c);
  } else if (std::holds_alternative<CmdStop>(c)) {
    compare_.cancel();
    playing_ = false;
    manual_steps_ = 0;
    if (has_run_ && !finished_) finish_run(FinishReason::Stopped);
  } else if (auto* cmp = std::get_if<CmdCompare>(&c)) {
    compare_.begin(cmp->prompt, cmp->steps, cmp->interleaved);
  } else if (auto* lm = std::get_if<CmdLoadModel>(&c)) {
    compare_.cancel();
    a_loading_ = true;
    auto eng = open_engine(lm->options);
    a_loading_ = false;
    if (!eng.ok()) {
      emit_error(ErrorOrigin::Model, eng.error().message);
      return;
    }
    replace_source(make_session_source(std::move(eng.value().session)));
    if (!eng.value().notice.empty()) {
      Event n{Event::Kind::Notice, run_};
      n.error = eng.value().notice;
      emit(std::move(n));
    }
  } else if (auto* o = std::get_if<CmdOpenRun>(&c)) {
    compare_.cancel();
    a_loading_ = true;
    auto rep = open_replay(o->path);
    a_loading_ = false;
    if (!rep.ok()) {
      emit_error(ErrorOrigin::Model, rep.error().message);
      return;
    }
    replace_source(std::move(rep.value()));
  } else if (auto* sv = std::get_if<CmdSave>(&c)) {
    save(*sv);
  }
}

void Controller::do_step() {
  a_busy_since_ns_ = now_ns();
  a_busy_ = true;
  Expected<StepTrace> tr = source_->step();
  a_busy_ = false;
  if (!tr.ok()) {
    emit_error(ErrorOrigin::Step, tr.error().message);
    finish_run(FinishReason::Error);
    return;
  }
  ++steps_;
  a_steps_ = steps_;
  Event e{Event::Kind::Step, run_};
  e.done_s = now_s();
  if (source_->is_replay()) {
    e.offset = source_->step_offset(tr->step);
  } else if (spool_) {
    auto off = spool_->append_step(tr.value());
    if (off.ok()) {
      e.offset = off.value();
    } else {
      spool_.reset();
      Event n{Event::Kind::Notice, run_};
      n.error = "history: " + off.error().message + "; later steps cannot be revisited or saved";
      emit(std::move(n));
    }
  }
  const int step = tr->step;
  const int32_t token = tr->token_id;
  auto full = std::make_shared<StepTrace>(std::move(tr.value()));
  e.trace = full;
  emit_step(std::move(e), std::move(full));
  if (!compare_.after_step(step, token)) return;
  // Interleaved, the run ends after the NO CACHE step that goes with this one.
  if (source_->done() && !compare_.ends_runs()) finish_run(source_->stop_reason());
}

void Controller::run() {
  if (source_) emit_source();
  Clock::time_point next_due = Clock::now();
  while (!quit_) {
    std::deque<Command> batch;
    {
      std::unique_lock<std::mutex> lock(cmd_mu_);
      auto ready = [&] { return !commands_.empty() || quit_.load(); };
      const bool unpaced = speed_ == kSpeedMax || compare_.active() || manual_steps_ > 0;
      if (!can_step())
        cmd_cv_.wait(lock, ready);
      else if (!unpaced)
        cmd_cv_.wait_until(lock, next_due, ready);
      batch.swap(commands_);
    }
    if (quit_) break;
    for (Command& c : batch) {
      bool was_playing = playing_;
      handle(c);
      if (playing_ && !was_playing) next_due = Clock::now();
      if (quit_) break;
    }
    publish();
    if (quit_) break;
    const bool manual = manual_steps_ > 0;
    const bool unpaced = speed_ == kSpeedMax || compare_.active();
    if (can_step() && (manual || unpaced || Clock::now() >= next_due)) {
      Clock::time_point started = Clock::now();
      if (manual) --manual_steps_;
      // Interleaved compare: the NO CACHE run catches up after each KV CACHE step.
      if (compare_.twin_due(steps_))
        do_twin_step();
      else
        do_step();
      if (!manual && !unpaced) {
        // Pace from the step's start; a step slower than the period starts the next at once.
        auto period = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(1.0 / speed_));
        next_due = std::max(started + period, Clock::now());
      }
      publish();
    }
  }
  a_playing_ = false;
  a_busy_ = false;
}

}  // namespace kvscope::app
