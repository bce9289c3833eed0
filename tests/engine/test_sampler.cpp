// test_sampler.cpp — the penalties against hand-worked examples on a five-token logit
// vector (repetition with llama.cpp's convention, frequency and presence with OpenAI's,
// no-repeat n-grams, logit bias, the tokens a minimum length holds back), their range
// checks, and a session on a tiny model: a minimum length holds back the end token a bias
// forces, a stop token id ends the run, and the trace keeps each candidate's logit before
// and after the penalties.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "engine/cpu/cpu_backend.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

const std::vector<float> kLogits{2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> penalized(const PenaltyConfig& p, const std::vector<int32_t>& seq) {
  std::vector<float> l = kLogits;
  apply_penalties(p, seq.data(), seq.size(), l);
  return l;
}

// The greedy pick (argmax_first) is exactly std::max_element's index on every kind of row:
// random rows of every length around its blocks of 16, ties (the first wins), +0 and -0,
// NaNs anywhere (never picked, except a NaN first, which max_element keeps), infinities,
// and a row of 49,152 values (a vocabulary) with its largest at a random place.
TEST(Greedy, ArgmaxFirstIsMaxElementsIndexOnEveryRow) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  auto want = [](const std::vector<float>& v) {
    return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
  };
  std::vector<std::vector<float>> rows = {
      {1.0f},
      {nan},
      {nan, 3.0f, 5.0f},
      {2.0f, nan, 7.0f, nan},
      {-inf, nan, -inf},
      {-0.0f, 0.0f, -1.0f},
      {0.0f, -0.0f},
      {-inf, -inf, -inf},
      {1.0f, inf, 2.0f, inf},
  };
  for (int n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 49152}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = u(rng);
      if (trial == 1) v[rng() % v.size()] = 9.0f;  // one clear largest
      if (trial == 2) {                            // ties: the same largest value at three places
        for (int k = 0; k < 3; ++k) v[rng() % v.size()] = 9.0f;
      }
      if (trial == 3) {  // NaNs scattered, none first
        for (int k = 0; k < 4 && n > 1; ++k) v[1 + rng() % (v.size() - 1)] = nan;
      }
      if (trial == 4) v[0] = nan;
      if (trial == 5) {  // all the same but a -0 / +0 pair on top
        std::fill(v.begin(), v.end(), -1.0f);
        v[rng() % v.size()] = 0.0f;
        v[rng() % v.size()] = -0.0f;
      }
      rows.push_back(v);
    }
  }
  for (const auto& v : rows) ASSERT_EQ(argmax_first(v), want(v)) << "n=" << v.size();
  EXPECT_EQ(argmax_first(std::vector<float>{}), -1);
}

// The order temperature sampling walks (ids_by_probability, a radix sort) is exactly the
// comparison order: descending probability, ties by lower id. Rows of every size around
// the sort's digits, with ties, exact zeros, +0 / -0 (equal), subnormals, 1, negative
// values and a softmax of a 49,152-token vocabulary; and the kept ids of every filter,
// top-k below and above the partial-sort limit, match the same reference cut.
TEST(Sampling, IdsByProbabilityAreTheComparisonOrder) {
  std::mt19937 rng(11);
  auto reference = [](const std::vector<float>& p) {
    std::vector<int32_t> ids(p.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    return ids;
  };
  std::vector<std::vector<float>> rows = {
      {}, {0.5f}, {0.0f, -0.0f, 0.0f}, {-0.0f, 1e-45f, 0.0f}, {-1.0f, 2.0f, -3.0f, 0.0f, -0.5f}};
  for (int n : {2, 7, 2047, 2049, 5000}) {
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    rows.push_back(v);
    for (float& x : v) x = float(rng() % 5) * 0.25f;  // many ties, zeros among them
    rows.push_back(v);
    for (float& x : v) x = std::ldexp(u(rng), -int(rng() % 160));  // down to subnormals
    rows.push_back(v);
  }
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<float> vocab(49152);
  for (float& x : vocab) x = logit(rng);
  const std::vector<float> soft = softmax_with_temperature(vocab, 0.8f);
  rows.push_back(soft);
  for (const auto& p : rows) ASSERT_EQ(ids_by_probability(p), reference(p)) << "n=" << p.size();

  const std::vector<int32_t> order = reference(soft);
  for (int k : {0, 1, 40, 256, 257, 5000}) {
    for (float top_p : {1.0f, 0.9f, 0.5f}) {
      for (float min_p : {0.0f, 0.05f}) {
        SamplerConfig c;
        c.temperature = 0.8f;
        c.top_k = k;
        c.top_p = top_p;
        c.min_p = min_p;
        // The cut by hand: top-k, then min-p against the best, then the top-p prefix.
        std::vector<int32_t> want(order.begin(), order.begin() + (k > 0 ? k : int(order.size())));
        while (min_p > 0 && want.size() > 1 &&
               soft[size_t(want.back())] < min_p * soft[size_t(want[0])])
          want.pop_back();
        if (top_p < 1.0f) {
          double cum = 0;
          size_t m = 0;
          while (m < want.size() && cum < top_p) cum += soft[size_t(want[m++])];
          want.resize(std::max<size_t>(1, m));
        }
        ASSERT_EQ(sampler_kept_ids(soft, c), want)
            << "k=" << k << " top_p=" << top_p << " min_p=" << min_p;
      }
    }
  }
}

// sample_softmax, handed the softmax, draws what sample draws from the logits, draw after
// draw from the same seed.
TEST(Sampling, SampleSoftmaxIsSampleFromTheLogits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  std::vector<float> l(3000);
  for (float& x : l) x = logit(rng);
  SamplerConfig c;
  c.temperature = 1.3f;
  c.top_p = 0.95f;
  c.seed = 21;
  Sampler a(c), b(c);
  const std::vector<float> p = softmax_with_temperature(l, c.temperature);
  std::vector<int32_t> drawn;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = a.sample(l);
    ASSERT_EQ(b.sample_softmax(p), t) << "draw " << i;
    drawn.push_back(t);
  }
  std::sort(drawn.begin(), drawn.end());
  EXPECT_GT(std::unique(drawn.begin(), drawn.end()) - drawn.begin(), 20);  // a real draw
}

TEST(Penalties, RepetitionDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  PenaltyConfig p;
  p.repeat = 2.0f;
  // Seen: 0 (2.0 -> 1.0), 1 twice (-1.0 -> -2.0: once, however often), 4 (-2.0 -> -4.0).
  EXPECT_EQ(penalized(p, {0, 1, 1, 4}), (std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f, -4.0f}));
  // Only the last 2 tokens (1, 4) count.
  p.last_n = 2;
  EXPECT_EQ(penalized(p, {0, 1, 1, 4}), (std::vector<float>{2.0f, -2.0f, 0.5f, 3.0f, -4.0f}));
  p.last_n = 0;
  EXPECT_EQ(penalized(p, {0, 1, 1, 4}), kLogits);
  p.last_n = -1;  // the whole sequence
  EXPECT_EQ(penalized(p, {0, 3, 3, 3, 3}), (std::vector<float>{1.0f, -1.0f, 0.5f, 1.5f, -2.0f}));
  EXPECT_FALSE(PenaltyConfig{}.active());
  EXPECT_TRUE(p.active());
}

TEST(Penalties, FrequencyCountsOccurrencesPresenceOnlyWhetherSeen) {
  PenaltyConfig p;
  p.frequency = 0.5f;
  p.presence = 0.25f;
  // 0 once: 2 - 0.5 - 0.25; 1 twice: -1 - 1.0 - 0.25; 4 once: -2 - 0.5 - 0.25.
  EXPECT_EQ(penalized(p, {0, 1, 1, 4}),
            (std::vector<float>{1.25f, -2.25f, 0.5f, 3.0f, -2.75f}));
  // Negative values encourage repeats.
  p.frequency = -1.0f;
  p.presence = 0.0f;
  EXPECT_EQ(penalized(p, {2, 2}), (std::vector<float>{2.0f, -1.0f, 2.5f, 3.0f, -2.0f}));
  // Repetition first, then frequency and presence: 1 (twice) -1 x 2 - 2 x 0.5 - 0.25.
  p.repeat = 2.0f;
  p.frequency = 0.5f;
  p.presence = 0.25f;
  EXPECT_EQ(penalized(p, {1, 1})[1], -3.25f);
}

TEST(Penalties, NoRepeatNgramBansTheTokensThatWouldCompleteASeenNgram) {
  PenaltyConfig p;
  p.no_repeat_ngram = 2;
  // Last token 3; the 2-grams seen after a 3 are (3, 1) and (3, 2): 1 and 2 are banned.
  EXPECT_EQ(penalized(p, {3, 1, 3, 2, 3}), (std::vector<float>{2.0f, -kInf, -kInf, 3.0f, -2.0f}));
  // Last two tokens (1, 2); (1, 2, 0) was seen: 0 is banned, nothing else.
  p.no_repeat_ngram = 3;
  EXPECT_EQ(penalized(p, {1, 2, 0, 1, 2}), (std::vector<float>{-kInf, -1.0f, 0.5f, 3.0f, -2.0f}));
  // (2, 0, 3) never followed (2, 0) ... the last two (0, 4) were never seen: nothing banned.
  EXPECT_EQ(penalized(p, {1, 2, 0, 4}), kLogits);
  // Shorter than the n-gram: nothing to repeat.
  EXPECT_EQ(penalized(p, {1}), kLogits);
  // n = 1: no token may appear twice.
  p.no_repeat_ngram = 1;
  EXPECT_EQ(penalized(p, {4, 0}), (std::vector<float>{-kInf, -1.0f, 0.5f, 3.0f, -kInf}));
}

TEST(Penalties, LogitBiasAddsAndAMinimumLengthHoldsTokensBack) {
  PenaltyConfig p;
  p.logit_bias = {{3, -100.0f}, {2, 5.0f}};
  EXPECT_EQ(penalized(p, {}), (std::vector<float>{2.0f, -1.0f, 5.5f, -97.0f, -2.0f}));
  std::vector<float> l = kLogits;
  shape_logits(PenaltyConfig{}, nullptr, 0, {3, 0}, l);
  EXPECT_EQ(l, (std::vector<float>{-kInf, -1.0f, 0.5f, -kInf, -2.0f}));
  // The greedy choice moves with it; a held-back token never comes out.
  Sampler greedy;
  EXPECT_EQ(greedy.sample(kLogits), 3);
  EXPECT_EQ(greedy.sample(l), 2);
  SamplerConfig hot_cfg;
  hot_cfg.temperature = 2.0f;
  hot_cfg.seed = 9;
  Sampler hot(hot_cfg);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = hot.sample(l);
    ASSERT_NE(t, 0);
    ASSERT_NE(t, 3);
  }
}

TEST(Penalties, OutOfRangeValuesAreOneClearError) {
  const auto err = [](PenaltyConfig p) {
    Status s = penalty_config_check(p, 5);
    return s.ok() ? std::string() : s.message();
  };
  EXPECT_EQ(err({}), "");
  PenaltyConfig p;
  p.repeat = 0.0f;
  EXPECT_EQ(err(p), "repeat-penalty: 0 is outside (0, 10] (1 = off)");
  p = {};
  p.frequency = 2.5f;
  EXPECT_EQ(err(p), "frequency-penalty: 2.5 is outside [-2, 2]");
  p = {};
  p.presence = -3.0f;
  EXPECT_EQ(err(p), "presence-penalty: -3 is outside [-2, 2]");
  p = {};
  p.last_n = -2;
  EXPECT_EQ(err(p), "repeat-last-n: -2 is below -1 (-1 = the whole sequence)");
  p = {};
  p.no_repeat_ngram = 65;
  EXPECT_EQ(err(p), "no-repeat-ngram: 65 is outside 0..64 (0 = off)");
  p = {};
  p.logit_bias = {{5, 1.0f}};
  EXPECT_EQ(err(p), "logit-bias: token id 5 is outside the vocabulary [0, 5)");
  p.logit_bias = {{1, 101.0f}};
  EXPECT_EQ(err(p), "logit-bias: 101 for token 1 is outside [-100, 100]");
  p.repeat = std::nanf("");
  EXPECT_NE(err(p), "");
}

class SessionPenalties : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path =
        ::testing::TempDir() + "/kvscope_penalties_tiny." + std::to_string(::getpid()) + ".gguf";
    ASSERT_TRUE(test::write_tiny_llama(test::TinyModelSpec{}, path).ok());
    auto m = Model::load(path);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(m.value());
  }
  static void TearDownTestSuite() { model_.reset(); }
  static std::unique_ptr<Session> make(SessionConfig c, const SamplerConfig& sc) {
    c.max_tokens = 12;
    auto s = Session::create(model_, make_cpu_backend(1), c);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    if (!s.ok()) return nullptr;
    (*s)->set_sampler(sc);
    EXPECT_TRUE((*s)->reset({"the tin can", false}).ok());
    return std::move(*s);
  }
  static std::vector<StepTrace> run(Session& s) {
    std::vector<StepTrace> out;
    while (!s.done()) {
      auto t = s.step();
      EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
      if (!t.ok()) break;
      out.push_back(std::move(*t));
    }
    return out;
  }
  static inline std::shared_ptr<const Model> model_;
};

TEST_F(SessionPenalties, AMinimumLengthHoldsBackTheEndTokenABiasForces) {
  const int32_t eos = model_->tokenizer().eos_id();
  ASSERT_GE(eos, 0);
  SamplerConfig sc;
  sc.penalties.logit_bias = {{eos, 100.0f}};
  // Without a minimum length the forced end token ends the run at once.
  auto a = make(SessionConfig{}, sc);
  ASSERT_TRUE(a);
  auto ta = run(*a);
  ASSERT_EQ(ta.size(), 1u);
  EXPECT_EQ(ta[0].token_id, eos);
  EXPECT_EQ(a->stop_reason(), StopReason::Eos);
  // With 4: four other tokens first, then the end token.
  SessionConfig c;
  c.min_tokens = 4;
  auto b = make(c, sc);
  ASSERT_TRUE(b);
  auto tb = run(*b);
  ASSERT_EQ(tb.size(), 5u);
  for (int i = 0; i < 4; ++i) EXPECT_NE(tb[size_t(i)].token_id, eos) << "step " << i + 1;
  EXPECT_EQ(tb[4].token_id, eos);
  EXPECT_EQ(b->stop_reason(), StopReason::Eos);
  // The trace: the end token's logit before (the model's own) and after the bias.
  const Candidate& top = tb[4].top[0];
  EXPECT_EQ(top.id, eos);
  EXPECT_EQ(top.raw_logit, b->last_logits()[size_t(eos)]);
  EXPECT_FLOAT_EQ(top.logit, top.raw_logit + 100.0f);
}

TEST_F(SessionPenalties, AStopTokenEndsTheRunAndPenaltiesChangeTheGreedyPath) {
  // The greedy path without penalties, then a stop id on its third token.
  SessionConfig nostop;
  nostop.stop_at_eos = false;
  auto p2 = make(nostop, SamplerConfig{});
  const auto path = run(*p2);
  ASSERT_GE(path.size(), 3u);
  SessionConfig c;
  c.stop_at_eos = false;
  c.stop_ids = {path[2].token_id};
  auto s = make(c, SamplerConfig{});
  const auto ts = run(*s);
  // The first occurrence of that id on the path ends it.
  size_t first = 0;
  while (path[first].token_id != path[2].token_id) ++first;
  ASSERT_EQ(ts.size(), first + 1);
  EXPECT_EQ(s->stop_reason(), StopReason::StopToken);
  EXPECT_EQ(ts.back().stop, StopReason::StopToken);
  // A strong repetition penalty with a no-repeat bigram: no bigram occurs twice in what the
  // sampler produced, and every candidate's raw logit is the model's own.
  SamplerConfig sc;
  sc.penalties.repeat = 5.0f;
  sc.penalties.no_repeat_ngram = 2;
  auto q = make(nostop, sc);
  const auto tq = run(*q);
  std::vector<int32_t> seq = q->history();
  for (size_t i = 0; i + 1 < seq.size(); ++i)
    for (size_t j = i + 1; j + 1 < seq.size(); ++j)
      ASSERT_FALSE(seq[i] == seq[j] && seq[i + 1] == seq[j + 1] && int(j) >= q->prompt_len() - 1)
          << "bigram at " << i << " and " << j;
  EXPECT_EQ(tq.back().top[size_t(std::max(tq.back().sampled_rank, 0))].raw_logit,
            q->last_logits()[size_t(tq.back().top[size_t(std::max(tq.back().sampled_rank, 0))].id)]);
  EXPECT_NE(q->history(), p2->history()) << "the penalties changed nothing";
  // Bad ids and lengths are refused when the session is made.
  SessionConfig bad;
  bad.stop_ids = {model_->config().n_vocab};
  EXPECT_FALSE(Session::create(model_, make_cpu_backend(1), bad).ok());
  bad = {};
  bad.min_tokens = -1;
  EXPECT_FALSE(Session::create(model_, make_cpu_backend(1), bad).ok());
}

}  // namespace
}  // namespace kvscope
