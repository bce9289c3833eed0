// test_controller_compare.cpp — compare modes through the controller, one run after the other
// and interleaved step by step, on the tiny random-weight model (fast, also under the
// sanitizers): the two runs sample the same tokens, their cumulative K/V rows equal the
// closed forms (docs/design.md) exactly, the person's mode comes back, and a run that
// samples another token than its partner ends the comparison with an error. The headless
// driver (screenshots) runs the same comparison: the same events, phases and finish reasons
// as the controller.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>

#include "app/core/compare_view.h"
#include "app/core/run_driver.h"
#include "tests/app/controller_test_util.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::testing;

namespace {

// The closed forms (docs/design.md), after g steps, per layer: the cache computes K/V for the p prompt
// tokens and the g - 1 tokens fed back since (p + g counts the newest token too, whose K/V
// the next step computes); without it step t recomputes p + t - 1 rows, in all
// g·p + g(g-1)/2. Then what the compare plot draws: the measured cumulative rows on the
// guides, and the measured waste factor equal to the formula's.
void expect_closed_forms(const RunSeries* c, const RunSeries* n, int L, int kG) {
  ASSERT_TRUE(c && n);
  ASSERT_EQ(int(c->steps()), kG);
  ASSERT_EQ(int(n->steps()), kG);
  EXPECT_FALSE(c->mixed());
  EXPECT_FALSE(n->mixed());
  EXPECT_EQ(c->mode, CacheMode::Cache);
  EXPECT_EQ(n->mode, CacheMode::NoCache);
  const uint64_t p = uint64_t(c->prompt_len);
  EXPECT_EQ(p, uint64_t(n->prompt_len));
  EXPECT_GT(p, 5u);
  uint64_t cum_c = 0, cum_n = 0;
  for (uint64_t g = 1; g <= uint64_t(kG); ++g) {
    cum_c += c->kv_rows[g - 1];
    cum_n += n->kv_rows[g - 1];
    EXPECT_EQ(cum_c, L * (p + g - 1)) << "CACHE after " << g << " steps";
    EXPECT_EQ(cum_n, L * (g * p + g * (g - 1) / 2)) << "NO CACHE after " << g << " steps";
    EXPECT_EQ(c->seq_len[g - 1], int(p + g));
  }
  CompareView v = make_compare_view(c, n, L);
  ASSERT_TRUE(v.ready);
  EXPECT_EQ(v.p, int(p));
  EXPECT_EQ(v.g, kG);
  for (int i = 0; i < kG; ++i) {
    EXPECT_EQ(v.cache.cum_rows[size_t(i)], v.guide_cache_rows[size_t(i)]);
    EXPECT_EQ(v.nocache.cum_rows[size_t(i)], v.guide_nocache_rows[size_t(i)]);
    EXPECT_EQ(v.cache.seq_len[size_t(i)], v.nocache.seq_len[size_t(i)]);
  }
  EXPECT_DOUBLE_EQ(v.waste_rows, v.waste_formula);
  EXPECT_DOUBLE_EQ(v.waste_formula, double(kG * p + kG * (kG - 1) / 2) / double(p + kG - 1));
  EXPECT_GT(v.waste_flops, 1.5);
  EXPECT_LT(v.waste_seeds, v.waste_formula);
}

CacheMode last_mode(const std::vector<Event>& ev, CacheMode start) {
  for (const Event& e : ev)
    if (e.kind == Event::Kind::ModeChanged) start = e.mode;
  return start;
}

// Drains what is left a moment after the last expected event (the mode restore).
void settle(Controller& ctl, std::vector<Event>& ev) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (Event& e : ctl.poll()) ev.push_back(std::move(e));
}

// A live source that, in NO CACHE mode, reports another token than the model's at step `at`
// (so does its twin): stands in for a NO CACHE path that has drifted from the cache's.
class DriftingSource final : public ForwardingSource {
 public:
  DriftingSource(std::unique_ptr<StepSource> inner, int at)
      : ForwardingSource(std::move(inner)), at_(at) {}
  Expected<StepTrace> step() override {
    auto t = inner_->step();
    if (t.ok() && inner_->mode() == CacheMode::NoCache && t->step == at_) t.value().token_id += 1;
    return t;
  }
  Expected<std::unique_ptr<StepSource>> twin(CacheMode mode) const override {
    auto t = inner_->twin(mode);
    if (!t.ok()) return t.error();
    return std::unique_ptr<StepSource>(std::make_unique<DriftingSource>(std::move(t.value()), at_));
  }

 private:
  int at_;
};

// A live source that keeps the description of the backend its twin runs on (read by the
// test after the controller's worker made the twin).
class TwinBackendSource final : public ForwardingSource {
 public:
  struct Seen {
    std::mutex mu;
    std::string backend;
    std::string get() {
      std::lock_guard<std::mutex> lk(mu);
      return backend;
    }
  };
  TwinBackendSource(std::unique_ptr<StepSource> inner, std::shared_ptr<Seen> seen)
      : ForwardingSource(std::move(inner)), seen_(std::move(seen)) {}
  Expected<std::unique_ptr<StepSource>> twin(CacheMode mode) const override {
    auto t = inner_->twin(mode);
    if (t.ok()) {
      std::lock_guard<std::mutex> lk(seen_->mu);
      seen_->backend = t.value()->facts().backend;
    }
    return t;
  }

 private:
  std::shared_ptr<Seen> seen_;
};

}  // namespace

TEST(ControllerCompare, SequentialKvRowsEqualTheClosedForms) {
  constexpr int kG = 12;
  auto src = tiny_source(200);
  const int L = src->facts().n_layer;
  auto ctl = std::make_unique<Controller>(std::move(src), test_options());
  std::vector<Event> ev;
  ctl->send(CmdMode{CacheMode::NoCache});  // the person's mode, restored afterwards
  ctl->send(CmdCompare{kStory, kG});
  collect(*ctl, ev, [](auto& e) { return finished(e, 2); });
  ASSERT_TRUE(finished(ev, 2));
  settle(*ctl, ev);
  EXPECT_EQ(ctl->state().compare, ComparePhase::None);
  Timeline tl;
  std::vector<int32_t> tokens[3];
  for (const Event& e : ev) {
    EXPECT_NE(e.kind, Event::Kind::Error) << e.error;
    tl.apply(e);
    if (e.kind == Event::Kind::Reset) {
      EXPECT_EQ(e.compare, ComparePhase(e.run)) << "leg " << e.run;
    }
    if (e.kind == Event::Kind::Step) tokens[e.run].push_back(e.trace->token_id);
  }
  EXPECT_EQ(last_mode(ev, CacheMode::Cache), CacheMode::NoCache) << "the person's mode is restored";
  EXPECT_EQ(tokens[1], tokens[2]) << "CACHE and NO CACHE gave different tokens";
  expect_closed_forms(tl.history().find(kStory.text, false, CacheMode::Cache),
                      tl.history().find(kStory.text, false, CacheMode::NoCache), L, kG);
}

// Interleaved: one run of each mode, stepped in turn (KV CACHE step t, then NO CACHE step t),
// in the same order the controller produced them, on a second session of the same model.
TEST(ControllerCompare, InterleavedKvRowsEqualTheClosedForms) {
  constexpr int kG = 8;
  auto src = tiny_source(200);
  const int L = src->facts().n_layer;
  const std::string backend = src->facts().backend;  // "cpu (1 thread, <isa>)"
  auto seen = std::make_shared<TwinBackendSource::Seen>();
  auto ctl = std::make_unique<Controller>(std::make_unique<TwinBackendSource>(std::move(src), seen),
                                          test_options());
  std::vector<Event> ev;
  ctl->send(CmdMode{CacheMode::NoCache});
  ctl->send(CmdCompare{kStory, kG, true});
  collect(*ctl, ev, [](auto& e) { return finished(e, 1); });
  ASSERT_TRUE(finished(ev, 1));
  settle(*ctl, ev);
  EXPECT_EQ(ctl->state().compare, ComparePhase::None);
  Timeline tl;
  std::vector<int32_t> cache_tokens, nocache_tokens;
  std::string order;  // "C" for a KV CACHE step, "N" for a NO CACHE step
  FinishReason reason = FinishReason::Running;
  for (const Event& e : ev) {
    EXPECT_NE(e.kind, Event::Kind::Error) << e.error;
    tl.apply(e);
    if (e.kind == Event::Kind::Reset) {
      EXPECT_EQ(e.compare, ComparePhase::Interleaved);
      EXPECT_EQ(e.mode, CacheMode::Cache);
    }
    if (e.kind == Event::Kind::Step) {
      EXPECT_EQ(e.trace->mode, CacheMode::Cache);
      EXPECT_EQ(e.trace->step, int(cache_tokens.size()) + 1);
      cache_tokens.push_back(e.trace->token_id);
      order += 'C';
    }
    if (e.kind == Event::Kind::CompareStep) {
      EXPECT_EQ(e.run, 1u);
      EXPECT_EQ(e.trace->mode, CacheMode::NoCache);
      EXPECT_EQ(e.trace->step, int(nocache_tokens.size()) + 1);
      EXPECT_TRUE(e.trace->attention.empty()) << "the NO CACHE steps come without their rows";
      nocache_tokens.push_back(e.trace->token_id);
      order += 'N';
    }
    if (e.kind == Event::Kind::Finished) reason = e.reason;
  }
  std::string alternating;
  for (int i = 0; i < kG; ++i) alternating += "CN";
  EXPECT_EQ(order, alternating);
  EXPECT_EQ(reason, FinishReason::MaxTokens);
  EXPECT_EQ(cache_tokens, nocache_tokens) << "CACHE and NO CACHE gave different tokens";
  EXPECT_EQ(last_mode(ev, CacheMode::Cache), CacheMode::NoCache) << "the person's mode is restored";
  EXPECT_EQ(tl.compare_phase(), ComparePhase::Interleaved);
  const RunSeries* c = tl.history().find(kStory.text, false, CacheMode::Cache);
  const RunSeries* n = tl.history().find(kStory.text, false, CacheMode::NoCache);
  expect_closed_forms(c, n, L, kG);
  ASSERT_TRUE(c && n);
  EXPECT_TRUE(c->finished && n->finished);
  EXPECT_EQ(tl.current_series(), c);
  EXPECT_EQ(tl.other_series(), n);  // the Plots panel overlays it on this run's
  // The NO CACHE run's session runs on a backend like the first: the CPU, with as many
  // threads (1 here, not the hardware's count that 0 would give).
  EXPECT_NE(backend.find("cpu (1 thread,"), std::string::npos) << backend;
  EXPECT_EQ(seen->get(), backend) << "the second session's backend differs from the first's";
}

// Both ways, a run that samples another token than its partner stops the comparison at that
// step with an error that says so, and the person's mode comes back.
TEST(ControllerCompare, DifferentTokensEndTheComparisonWithAnError) {
  for (bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "one after the other");
    auto src = std::make_unique<DriftingSource>(tiny_source(200), 3);
    auto ctl = std::make_unique<Controller>(std::move(src), test_options());
    std::vector<Event> ev;
    ctl->send(CmdCompare{kStory, 6, interleaved});
    const uint64_t last_run = interleaved ? 1 : 2;
    collect(*ctl, ev, [&](auto& e) { return finished(e, last_run); });
    ASSERT_TRUE(finished(ev, last_run));
    settle(*ctl, ev);
    std::string error;
    FinishReason reason = FinishReason::Running;
    for (const Event& e : ev) {
      if (e.kind == Event::Kind::Error) error = e.error;
      if (e.kind == Event::Kind::Finished && e.run == last_run) reason = e.reason;
    }
    EXPECT_NE(error.find("at step 3"), std::string::npos) << error;
    EXPECT_NE(error.find("must give the same tokens"), std::string::npos) << error;
    EXPECT_EQ(reason, FinishReason::Error);
    EXPECT_EQ(ctl->state().compare, ComparePhase::None);
    EXPECT_TRUE(ctl->state().finished);
  }
}

namespace {

// What a comparison did, event by event, leaving out what only the app has (its source,
// history notices) and what differs between two runs of it (times, attention rows).
std::string signature(const Event& e) {
  std::string run = "@";
  run += std::to_string(e.run);
  switch (e.kind) {
    case Event::Kind::Reset:
      return std::string("reset") + run + " " + to_string(e.compare) + " " +
             cache_mode_name(e.mode);
    case Event::Kind::ModeChanged:
      return std::string("mode") + run + " " + cache_mode_name(e.mode);
    case Event::Kind::Step:
      return std::string("step") + run + " " + std::to_string(e.trace->step) + ":" +
             std::to_string(e.trace->token_id) + " " + cache_mode_name(e.trace->mode);
    case Event::Kind::CompareStep:
      return std::string("nocache") + run + " " + std::to_string(e.trace->step) + ":" +
             std::to_string(e.trace->token_id);
    case Event::Kind::Error:
      return std::string("error") + run + " " + e.error;
    case Event::Kind::Finished:
      return std::string("finished") + run + " " + to_string(e.reason);
    default:
      return "";
  }
}

std::vector<std::string> signatures(const std::vector<Event>& ev) {
  std::vector<std::string> out;
  for (const Event& e : ev)
    if (std::string s = signature(e); !s.empty()) out.push_back(std::move(s));
  return out;
}

std::unique_ptr<StepSource> compare_source(int drift_at) {
  std::unique_ptr<StepSource> src = tiny_source(200);
  if (drift_at > 0) src = std::make_unique<DriftingSource>(std::move(src), drift_at);
  EXPECT_TRUE(src->set_mode(CacheMode::NoCache).ok());  // the person's mode, restored after
  return src;
}

}  // namespace

// The app (the controller's worker) and a screenshot (drive_compare on the calling thread)
// run compare modes through one CompareRun: for the same prompt and settings, both ways and
// with a run that drifts, they produce the same events, phases and finish reasons.
TEST(ControllerCompare, HeadlessCaptureRunsTheSameComparison) {
  constexpr int kG = 6;
  for (int drift_at : {0, 4})
    for (bool interleaved : {false, true}) {
      SCOPED_TRACE(std::string(interleaved ? "interleaved" : "one after the other") +
                   (drift_at ? ", drifting" : ""));
      auto ctl = std::make_unique<Controller>(compare_source(drift_at), test_options());
      std::vector<Event> ev;
      ctl->send(CmdCompare{kStory, kG, interleaved});
      const uint64_t last_run = interleaved ? 1 : 2;
      collect(*ctl, ev, [&](auto& e) { return finished(e, last_run); });
      ASSERT_TRUE(finished(ev, last_run));
      settle(*ctl, ev);
      const std::vector<std::string> app = signatures(ev);

      auto src = compare_source(drift_at);
      std::vector<Event> hev;
      DriveOptions d;
      d.steps = kG;
      d.on_event = [&hev](const Event& e) { hev.push_back(e); };
      auto end = drive_compare(*src, kStory, interleaved, d);
      EXPECT_EQ(end.ok(), drift_at == 0);
      EXPECT_EQ(src->mode(), CacheMode::NoCache) << "the person's mode is restored";
      EXPECT_EQ(src->max_tokens(), 200) << "the person's token limit is restored";
      const std::vector<std::string> headless = signatures(hev);

      EXPECT_GT(app.size(), size_t(kG)) << "a comparison's events";
      EXPECT_EQ(headless, app);
      const std::string want = drift_at ? "error" : "max_tokens";
      EXPECT_NE(
          std::find(app.begin(), app.end(), "finished@" + std::to_string(last_run) + " " + want),
          app.end());
    }
}
