// controller.cpp — the session worker loop: commands in, events out, paced steps.
#include "app/controller.h"

#include <algorithm>
#include <chrono>

namespace kvscope::app {

using Clock = std::chrono::steady_clock;

Controller::Controller(std::unique_ptr<Session> session) : session_(std::move(session)) {
  worker_ = std::thread([this] { run(); });
}

Controller::~Controller() {
  send(CmdShutdown{});
  if (worker_.joinable()) worker_.join();
}

void Controller::send(Command c) {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.push_back(std::move(c));
  }
  cmd_cv_.notify_one();
}

std::vector<Event> Controller::poll() {
  std::lock_guard<std::mutex> lock(ev_mu_);
  std::vector<Event> out(std::make_move_iterator(events_.begin()),
                         std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

std::vector<Event> Controller::wait_events(int timeout_ms) {
  std::unique_lock<std::mutex> lock(ev_mu_);
  ev_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()),
                         std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

ControllerState Controller::state() const {
  ControllerState s;
  s.playing = a_playing_.load();
  s.busy = a_busy_.load();
  s.finished = a_finished_.load();
  s.speed = a_speed_.load();
  s.steps = a_steps_.load();
  if (s.busy) {
    s.computing_step = s.steps + 1;
    int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      Clock::now().time_since_epoch()).count();
    s.busy_seconds = std::max<int64_t>(0, now - a_busy_since_ns_.load()) * 1e-9;
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

void Controller::emit_error(std::string message) {
  Event e{Event::Kind::Error, run_};
  e.mode = session_->mode();
  e.error = std::move(message);
  emit(std::move(e));
}

void Controller::handle(Command& c) {
  if (auto* r = std::get_if<CmdReset>(&c)) {
    Status st = session_->reset(r->prompt);
    ++run_;
    a_steps_ = 0;
    if (!st.ok()) {
      has_prompt_ = false;
      finished_ = true;
      playing_ = false;
      emit_error(st.message());
      return;
    }
    has_prompt_ = true;
    finished_ = false;
    playing_ = r->autoplay;
    Event e{Event::Kind::Reset, run_};
    e.prompt_text = r->prompt.text;
    e.prompt_chat = r->prompt.chat;
    e.mode = session_->mode();
    emit(std::move(e));
  } else if (std::holds_alternative<CmdPlay>(c)) {
    playing_ = has_prompt_ && !finished_;
  } else if (std::holds_alternative<CmdPause>(c)) {
    playing_ = false;
  } else if (std::holds_alternative<CmdStep>(c)) {
    playing_ = false;
    if (has_prompt_ && !finished_) do_step();
  } else if (auto* s = std::get_if<CmdSpeed>(&c)) {
    speed_ = s->tokens_per_s <= kSpeedMax ? kSpeedMax
                                          : std::clamp(s->tokens_per_s, kSpeedMin, kSpeedTop);
  } else if (auto* m = std::get_if<CmdMode>(&c)) {
    Status st = session_->set_mode(m->mode);
    if (!st.ok()) {
      emit_error(st.message());
    } else {
      Event e{Event::Kind::ModeChanged, run_};
      e.mode = session_->mode();
      emit(std::move(e));
    }
  } else if (auto* sm = std::get_if<CmdSampler>(&c)) {
    session_->set_sampler(sm->sampler);
  } else if (auto* mt = std::get_if<CmdMaxTokens>(&c)) {
    session_->set_max_tokens(std::max(1, mt->max_tokens));
  } else if (std::holds_alternative<CmdStop>(c)) {
    playing_ = false;
    if (has_prompt_ && !finished_) {
      finished_ = true;
      emit({Event::Kind::Finished, run_});
    }
  } else if (std::holds_alternative<CmdShutdown>(c)) {
    quit_ = true;
    playing_ = false;
  }
}

void Controller::do_step() {
  a_busy_since_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         Clock::now().time_since_epoch()).count();
  a_busy_ = true;
  Expected<StepTrace> tr = session_->step();
  a_busy_ = false;
  if (!tr.ok()) {
    playing_ = false;
    finished_ = true;
    emit_error(tr.error().message);
    return;
  }
  a_steps_ = a_steps_ + 1;
  Event e{Event::Kind::Step, run_};
  e.trace = std::make_shared<const StepTrace>(std::move(tr.value()));
  emit(std::move(e));
  if (session_->done()) {
    finished_ = true;
    playing_ = false;
    emit({Event::Kind::Finished, run_});
  }
}

void Controller::run() {
  Clock::time_point next_due = Clock::now();
  while (true) {
    std::deque<Command> batch;
    {
      std::unique_lock<std::mutex> lock(cmd_mu_);
      auto ready = [&] { return !commands_.empty(); };
      if (playing_ && speed_ != kSpeedMax)
        cmd_cv_.wait_until(lock, next_due, ready);
      else if (!playing_)
        cmd_cv_.wait(lock, ready);
      batch.swap(commands_);
    }
    for (Command& c : batch) {
      bool was_playing = playing_;
      handle(c);
      if (playing_ && !was_playing) next_due = Clock::now();
      if (quit_) break;
    }
    a_playing_ = playing_;
    a_finished_ = finished_;
    a_speed_ = speed_;
    if (quit_) break;
    if (playing_ && !finished_ && (speed_ == kSpeedMax || Clock::now() >= next_due)) {
      Clock::time_point started = Clock::now();
      do_step();
      a_playing_ = playing_;
      a_finished_ = finished_;
      if (speed_ != kSpeedMax) {
        // Pace from the step's start; a step slower than the period starts the next at once.
        auto period = std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(1.0 / speed_));
        next_due = std::max(started + period, Clock::now());
      }
    }
  }
  a_playing_ = false;
}

}  // namespace kvscope::app
