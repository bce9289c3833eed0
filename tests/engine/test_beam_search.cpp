// test_beam_search.cpp — beam search over the paged pool:
//  - one beam is greedy decoding, token for token;
//  - every returned hypothesis's log probability and score equal those recomputed by
//    teacher forcing through a session;
//  - with as many beams as a tiny model has tokens, the best two-token continuation is the
//    one an exhaustive search over all 264 x 264 finds;
//  - beams share the prompt's blocks (the pool holds fewer blocks than the beams' tables
//    name) and the search stops and keeps finished hypotheses as documented.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>

#include "engine/beam_search.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/session.h"
#include "tests/util/model_fixture.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

double log_prob(const std::vector<float>& logits, int32_t id) {
  double mx = logits[0];
  for (float v : logits) mx = std::max(mx, double(v));
  double sum = 0;
  for (float v : logits) sum += std::exp(double(v) - mx);
  return double(logits[size_t(id)]) - mx - std::log(sum);
}

// The log probability of `gen` after `prompt`, by teacher forcing through a session.
double teacher_forced(std::shared_ptr<const Model> model, const std::vector<int32_t>& prompt,
                      const std::vector<int32_t>& gen) {
  SessionConfig c;
  c.max_tokens = int(gen.size()) + 1;
  c.stop_at_eos = false;
  auto s = Session::create(model, make_cpu_backend(2), c);
  EXPECT_TRUE(s.ok());
  EXPECT_TRUE((*s)->reset_tokens(prompt).ok());
  double sum = 0;
  for (int32_t t : gen) {
    EXPECT_TRUE((*s)->step_forced(t).ok());
    sum += log_prob((*s)->last_logits(), t);
  }
  return sum;
}

class BeamSearchTest : public ModelTest<DefaultModelFile> {
 protected:
  static std::vector<int32_t> prompt(const std::string& text) {
    auto ids = tokenize_prompt(*model_, {text, false});
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }
};

TEST_F(BeamSearchTest, OneBeamIsGreedy) {
  const auto p = prompt("The capital of France is");
  BeamConfig bc;
  bc.beams = 1;
  bc.max_tokens = 24;
  bc.stop_at_eos = false;
  auto be = make_cpu_backend(2);
  auto r = beam_search(*model_, *be, p, bc);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->hypotheses.size(), 1u);
  SessionConfig c = config(CacheMode::Cache, 24);
  c.stop_at_eos = false;
  auto s = session(c);
  ASSERT_TRUE(s->reset_tokens(p).ok());
  std::vector<int32_t> greedy;
  while (!s->done()) greedy.push_back(s->step()->token_id);
  EXPECT_EQ(r->hypotheses[0].tokens, greedy);
}

TEST_F(BeamSearchTest, ScoresAreTheTeacherForcedLogProbabilitiesAndBeamsShareBlocks) {
  const auto p = prompt(
      "Once upon a time, in a small village by the sea, there lived an old fisherman who went "
      "out every morning before dawn to cast his nets into the cold grey water, and every "
      "evening he came home with");
  ASSERT_GT(p.size(), 32u);
  for (int K : {4, 8}) {
    SCOPED_TRACE(K);
    BeamConfig bc;
    bc.beams = K;
    bc.max_tokens = 12;
    bc.length_penalty = 0.7f;
    auto be = make_cpu_backend(2);
    auto r = beam_search(*model_, *be, p, bc);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(int(r->hypotheses.size()), K);
    for (size_t i = 0; i < r->hypotheses.size(); ++i) {
      const Hypothesis& h = r->hypotheses[i];
      if (i > 0) {
        EXPECT_LE(h.score, r->hypotheses[i - 1].score) << "best first";
      }
      const double want = teacher_forced(model_, p, h.tokens);
      EXPECT_NEAR(h.logprob, want, 1e-3) << "hypothesis " << i;
      EXPECT_NEAR(h.score, want / std::pow(double(h.tokens.size()), 0.7), 1e-3);
    }
    // The prompt's full blocks are held once for all beams.
    const int prompt_full = int(p.size()) / 16;
    EXPECT_LE(r->stats.peak_blocks, r->stats.peak_unshared_blocks - (K - 1) * prompt_full);
    EXPECT_GT(r->stats.pruned, 0) << "some beam had no continuation among the best";
  }
}

// With K = V every two-token continuation is a candidate at the second step: beam search
// is then exhaustive and must find the best pair.
TEST(BeamSearchTiny, AsManyBeamsAsTokensFindsTheExhaustiveBest) {
  test::TinyModelSpec spec;
  spec.seed = 7;
  const std::string path =
      ::testing::TempDir() + "/kvscope_beams_tiny." + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok());
  std::shared_ptr<const Model> model = std::move(m.value());
  const int V = model->config().n_vocab;
  ASSERT_EQ(V, 264);
  const std::vector<int32_t> p{40, 41, 42};
  // Exhaustive: every first token, then the best second one given it.
  SessionConfig c;
  c.max_tokens = 4;
  c.stop_at_eos = false;
  auto s = Session::create(model, make_cpu_backend(1), c);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->reset_tokens(p).ok());
  ASSERT_TRUE((*s)->step_forced(0).ok());
  const std::vector<float> first = (*s)->last_logits();
  double best = -1e300;
  std::vector<int32_t> best_pair;
  for (int32_t t1 = 0; t1 < V; ++t1) {
    ASSERT_TRUE((*s)->reset_tokens(p).ok());
    ASSERT_TRUE((*s)->step_forced(t1).ok());
    ASSERT_TRUE((*s)->step_forced(0).ok());
    const std::vector<float>& second = (*s)->last_logits();
    for (int32_t t2 = 0; t2 < V; ++t2) {
      const double lp = log_prob(first, t1) + log_prob(second, t2);
      if (lp > best) {
        best = lp;
        best_pair = {t1, t2};
      }
    }
  }
  BeamConfig bc;
  bc.beams = V;
  bc.max_tokens = 2;
  bc.stop_at_eos = false;
  bc.length_penalty = 0;
  auto be = make_cpu_backend(1);
  auto r = beam_search(*model, *be, p, bc);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->hypotheses[0].tokens, best_pair);
  EXPECT_NEAR(r->hypotheses[0].logprob, best, 1e-6);
  // With 2 beams the search need not find it; it must still return two hypotheses.
  bc.beams = 2;
  auto r2 = beam_search(*model, *be, p, bc);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->hypotheses.size(), 2u);
  EXPECT_LE(r2->hypotheses[0].logprob, best + 1e-9);
}

// Finished hypotheses end with an end token; unfinished ones have max_tokens tokens; a
// bad setting is one clear error.
TEST(BeamSearchTiny, FinishedHypothesesEndWithAnEndTokenAndBadSettingsAreRefused) {
  test::TinyModelSpec spec;
  const std::string path =
      ::testing::TempDir() + "/kvscope_beams_tiny2." + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok());
  std::shared_ptr<const Model> model = std::move(m.value());
  const std::vector<int32_t> end = generation_end_ids(model->tokenizer());
  auto be = make_cpu_backend(1);
  BeamConfig bc;
  bc.beams = 16;
  bc.max_tokens = 6;
  auto r = beam_search(*model, *be, {40, 41, 42}, bc);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_FALSE(r->hypotheses.empty());
  for (const Hypothesis& h : r->hypotheses) {
    if (h.finished) {
      EXPECT_TRUE(std::count(end.begin(), end.end(), h.tokens.back()) == 1);
    } else {
      EXPECT_EQ(int(h.tokens.size()), 6);
    }
    for (size_t i = 0; i + 1 < h.tokens.size(); ++i)
      EXPECT_EQ(std::count(end.begin(), end.end(), h.tokens[i]), 0) << "an end token inside";
  }
  bc.beams = 0;
  auto bad = beam_search(*model, *be, {40}, bc);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "beams: 0 is outside 1..1024");
}

}  // namespace
}  // namespace kvscope
