// test_scheduler_beams.cpp — beam search inside the continuous-batching scheduler
// (Request::beams), on the default model:
//   - its hypotheses are beam_search's (engine/beam_search.h, tested against teacher
//     forcing and exhaustive search): the same tokens in the same order, the same
//     log-probabilities, alone and batched with other requests;
//   - one beam is plain greedy decoding;
//   - beams share blocks: the pool never holds more than the beams' tables name, and at
//     the step a beam is pruned its private blocks go back (the pool's invariants hold
//     after every step and nothing is held at the end);
//   - a pool too small for everyone preempts beams and the search still finds the same
//     hypotheses;
//   - a beam request holds its K seats of max_seqs from admission to its end;
//   - a server's searches one after another, each forgotten when read, keep finding the
//     same hypotheses, and a forgotten search's hypotheses are gone;
//   - bad settings are one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/beam_search.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "tests/util/model_fixture.h"

namespace kvscope {
namespace {

const char* const kPrompt =
    "Once upon a time, in a small village by the sea, there lived an old fisherman who";

class SchedulerBeams : public ModelTest<DefaultModelFile> {
 protected:
  static SchedulerConfig config() {
    SchedulerConfig c;
    c.context = 512;
    c.pool_blocks = 160;
    c.max_batch_tokens = 64;
    return c;
  }
  static std::unique_ptr<Scheduler> scheduler(const SchedulerConfig& c) {
    auto s = Scheduler::create(model_, *backend_, c);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? std::move(*s) : nullptr;
  }
  static Request beam_request(const std::vector<int32_t>& prompt, int K, int max_tokens,
                              float lp = 1.0f) {
    Request r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.beams = K;
    r.length_penalty = lp;
    return r;
  }
  // Runs to the end; the pool's invariants after every step, then `each` on the step.
  static void run(Scheduler& s, const std::function<void(const BatchStep&)>& each = {}) {
    for (int n = 0; !s.idle() && n < 2000; ++n) {
      auto st = s.step();
      ASSERT_TRUE(st.ok()) << st.error().message;
      const Status ok = s.check();
      ASSERT_TRUE(ok.ok()) << "step " << st->step << ": " << ok.error().message;
      if (each) each(*st);
    }
    ASSERT_TRUE(s.idle());
  }
  static BeamResult reference(const std::vector<int32_t>& prompt, int K, int max_tokens,
                              float lp = 1.0f) {
    BeamConfig bc;
    bc.beams = K;
    bc.max_tokens = max_tokens;
    bc.length_penalty = lp;
    auto r = beam_search(*model_, *backend_, prompt, bc);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(*r) : BeamResult{};
  }
  static void expect_same(const Scheduler& s, int first, const BeamResult& ref) {
    const auto got = s.beam_hypotheses(first);
    ASSERT_EQ(got.size(), ref.hypotheses.size());
    ASSERT_FALSE(got.empty());
    for (size_t i = 0; i < got.size(); ++i) {
      const Hypothesis& h = ref.hypotheses[i];
      EXPECT_EQ(s.generated(got[i].seq), h.tokens) << "hypothesis " << i;
      EXPECT_NEAR(got[i].logprob, h.logprob, 1e-3) << "hypothesis " << i;
      EXPECT_NEAR(got[i].score, h.score, 1e-3) << "hypothesis " << i;
      EXPECT_EQ(got[i].finished, h.finished) << "hypothesis " << i;
    }
  }
  static void SetUpTestSuite() {
    ModelTest<DefaultModelFile>::SetUpTestSuite();
    backend_ = make_cpu_backend(2);
  }
  static inline std::unique_ptr<Backend> backend_;
};

TEST_F(SchedulerBeams, HypothesesAreBeamSearchsAloneAndInABatch) {
  const auto p = tokens(kPrompt);
  for (float lp : {1.0f, 0.0f}) {
    const BeamResult ref = reference(p, 4, 20, lp);
    {
      auto s = scheduler(config());
      auto first = s->add(beam_request(p, 4, 20, lp));
      ASSERT_TRUE(first.ok()) << first.error().message;
      run(*s);
      expect_same(*s, *first, ref);
    }
    {  // with other requests around it, one arriving mid-search
      auto s = scheduler(config());
      Request other;
      other.prompt = tokens("The capital of France is");
      other.max_tokens = 30;
      ASSERT_TRUE(s->add(other).ok());
      auto first = s->add(beam_request(p, 4, 20, lp));
      ASSERT_TRUE(first.ok());
      other.arrival_step = 5;
      other.prompt = tokens("def add(a, b):\n    return");
      ASSERT_TRUE(s->add(other).ok());
      run(*s);
      expect_same(*s, *first, ref);
    }
  }
}

TEST_F(SchedulerBeams, OneBeamIsGreedy) {
  const auto p = tokens(kPrompt);
  SchedulerConfig c = config();
  c.stop_at_eos = false;
  auto s = scheduler(c);
  auto beam = s->add(beam_request(p, 1, 24));
  Request plain;
  plain.prompt = p;
  plain.max_tokens = 24;
  auto greedy = s->add(plain);
  ASSERT_TRUE(beam.ok() && greedy.ok());
  run(*s);
  const auto h = s->beam_hypotheses(*beam);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(s->generated(h[0].seq), s->generated(*greedy));
  EXPECT_EQ(s->generated(*greedy).size(), 24u);
}

TEST_F(SchedulerBeams, BeamsShareBlocksAndPrunedBeamsGiveThemBackInTheSameStep) {
  const auto p = tokens(kPrompt);
  SchedulerConfig c = config();
  c.stop_at_eos = false;
  auto s = scheduler(c);
  auto first = s->add(beam_request(p, 4, 24));
  ASSERT_TRUE(first.ok());
  int pruned = 0, forks = 0, cows = 0;
  run(*s, [&](const BatchStep& step) {
    // The pool's used blocks are exactly the blocks the live beams' tables name (a
    // pruned beam's own blocks are already back; nothing else holds any).
    std::set<int32_t> named;
    size_t table_entries = 0;
    for (int id : s->live_beams(*first)) {
      EXPECT_EQ(s->state(id), SeqState::Running);
      for (const StepRow& r : step.rows)
        if (r.seq == id) {
          named.insert(r.table.begin(), r.table.end());
          table_entries += r.table.size();
        }
    }
    if (!s->live_beams(*first).empty()) {
      EXPECT_EQ(int(named.size()), step.pool.counts.used) << "step " << step.step;
      if (s->live_beams(*first).size() > 1) {
        EXPECT_LT(named.size(), table_entries) << "beams share their prompt's blocks";
      }
    }
    for (const SchedEvent& e : step.events) {
      pruned += e.kind == EventKind::Finish && e.detail == "pruned";
      forks += e.kind == EventKind::Fork;
      cows += e.kind == EventKind::Cow;
    }
  });
  EXPECT_GT(forks, 3);
  EXPECT_GT(pruned, 0);
  EXPECT_GT(cows, 0);
  EXPECT_EQ(s->pool().counts().used, 0);
  EXPECT_LT(s->stats().peak_kv_bytes, s->stats().unshared_kv_bytes);
  EXPECT_EQ(s->beam_hypotheses(*first).size(), 4u);
}

TEST_F(SchedulerBeams, PreemptedBeamsFindTheSameHypotheses) {
  const auto p = tokens(kPrompt);
  const BeamResult ref = reference(p, 4, 24);
  SchedulerConfig c = config();
  c.block_size = 16;
  // Four unshared copies of prompt + 24 tokens (3 blocks each) just fit; other requests
  // make the pool short, and the newest running sequence (often a beam) is preempted.
  c.pool_blocks = 12;
  auto s = scheduler(c);
  Request other;
  other.prompt = tokens("The capital of France is Paris. The capital of Germany is");
  other.max_tokens = 40;
  ASSERT_TRUE(s->add(other).ok());
  auto first = s->add(beam_request(p, 4, 24));
  ASSERT_TRUE(first.ok()) << first.error().message;
  other.prompt = tokens("Water boils at a temperature of");
  other.arrival_step = 3;
  auto third = s->add(other);
  ASSERT_TRUE(third.ok());
  int beams_preempted = 0;
  run(*s, [&](const BatchStep& st) {
    for (const SchedEvent& e : st.events)
      beams_preempted += e.kind == EventKind::Preempt && e.seq != 0 && e.seq != *third;
  });
  EXPECT_GT(beams_preempted, 0);
  expect_same(*s, *first, ref);
}

TEST_F(SchedulerBeams, ABeamRequestHoldsItsSeats) {
  const auto p = tokens(kPrompt);
  SchedulerConfig c = config();
  c.max_seqs = 4;
  c.stop_at_eos = false;
  auto s = scheduler(c);
  auto first = s->add(beam_request(p, 4, 12));
  Request other;
  other.prompt = tokens("The capital of France is");
  other.max_tokens = 4;
  auto later = s->add(other);
  ASSERT_TRUE(first.ok() && later.ok());
  bool beams_ended = false;
  while (!s->idle()) {
    auto st = s->step();
    ASSERT_TRUE(st.ok());
    EXPECT_LE(st->running, 4);
    if (s->state(*later) != SeqState::Waiting) {
      EXPECT_TRUE(beams_ended) << "admitted at step " << st->step << " while 4 beams hold the seats";
    }
    beams_ended = s->live_beams(*first).empty() && s->state(*first) != SeqState::Waiting;
  }
  EXPECT_EQ(s->generated(*later).size(), 4u);
}

TEST_F(SchedulerBeams, SearchesOneAfterAnotherForgottenWhenReadFindTheSameHypotheses) {
  const auto p = tokens(kPrompt);
  const BeamResult ref = reference(p, 3, 10);
  auto s = scheduler(config());
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    auto first = s->add(beam_request(p, 3, 10));
    ASSERT_TRUE(first.ok()) << first.error().message;
    // A plain request beside it, forgotten too: only the search's sets matter here.
    Request other;
    other.prompt = tokens("The capital of France is");
    other.max_tokens = 6;
    auto plain = s->add(other);
    ASSERT_TRUE(plain.ok());
    run(*s);
    expect_same(*s, *first, ref);
    const auto hyps = s->beam_hypotheses(*first);
    // Every sequence of this round: the search's first, the request beside it, the beams.
    for (int id = *first; id < s->size(); ++id) ASSERT_TRUE(s->forget(id).ok()) << id;
    EXPECT_TRUE(s->beam_hypotheses(*first).empty());
    EXPECT_TRUE(s->live_beams(*first).empty());
    for (const BeamHypothesis& h : hyps) EXPECT_TRUE(s->live_beams(h.seq).empty());
    EXPECT_EQ(s->pool().counts().used, 0);
    EXPECT_TRUE(s->check().ok());
  }
}

TEST_F(SchedulerBeams, CancellingABeamCancelsTheSearch) {
  const auto p = tokens(kPrompt);
  auto s = scheduler(config());
  auto first = s->add(beam_request(p, 4, 40));
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->step().ok());
  const auto live = s->live_beams(*first);
  ASSERT_GT(live.size(), 1u);
  ASSERT_TRUE(s->cancel(live.back()).ok());
  for (int id : live) EXPECT_EQ(s->state(id), SeqState::Cancelled);
  EXPECT_TRUE(s->idle());
  EXPECT_EQ(s->pool().counts().used, 0);
  EXPECT_TRUE(s->check().ok());
}

TEST_F(SchedulerBeams, BadSettingsAreOneClearError) {
  const auto p = tokens(kPrompt);
  SchedulerConfig c = config();
  c.max_seqs = 8;
  auto s = scheduler(c);
  const auto refused = [&](Request r, const std::string& words) {
    auto id = s->add(r);
    ASSERT_FALSE(id.ok()) << words;
    EXPECT_NE(id.error().message.find(words), std::string::npos) << id.error().message;
  };
  refused(beam_request(p, 9, 8), "9 beams; 1 to 8");
  refused(beam_request(p, -1, 8), "-1 beams");
  Request r = beam_request(p, 4, 8);
  r.n = 2;
  refused(r, "no samples");
  r = beam_request(p, 4, 8);
  r.sampler.penalties.repeat = 1.3f;
  refused(r, "no penalties");
  r = beam_request(p, 4, 8, 99.0f);
  refused(r, "length penalty 99");
  r = beam_request(p, 4, 600);
  refused(r, "beam tokens need more than the 512 positions");
  SchedulerConfig small = config();
  small.pool_blocks = 8;
  auto t = scheduler(small);
  auto id = t->add(beam_request(p, 4, 24));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.error().message.find("in each beam"), std::string::npos) << id.error().message;
}

}  // namespace
}  // namespace kvscope
