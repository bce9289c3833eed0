// test_speculative.cpp — speculative decoding:
//  - greedy with each drafter (ngram prompt lookup, an early exit of the model itself, and a
//    draft model) gives exactly plain greedy's tokens over 64 tokens on both built-in
//    models, the logits of every emitted position bit for bit, and KV_CACHE equal at every
//    step (a rolled-back draft leaves no block behind);
//  - sampling keeps the target's distribution: on a tiny model with an early-exit draft
//    (a different distribution), the first verified token over 3,000 seeded draws, and the
//    next one given it, pass a chi-square test against the target sampler's distribution at
//    significance 0.001, and fail it against the draft's;
//  - the acceptance rule on hand-worked distributions; the lookup drafter by hand; the
//    rollback of a paged cache returns the pool and the table exactly;
//  - bad settings are one clear error.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <map>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "tests/util/model_fixture.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

TEST(Speculative, TheLookupDrafterProposesWhatFollowedTheLatestEarlierMatch) {
  auto d = make_ngram_drafter(3);
  std::mt19937_64 rng(1);
  std::vector<int32_t> draft;
  std::vector<std::vector<float>> q;
  // Suffix (7, 8, 9) occurred at 1..3, followed by 4 5; it also occurs at 5..7 followed
  // by 7 8 9 (the latest match, whose continuation runs into the suffix itself).
  ASSERT_TRUE(d->propose({1, 7, 8, 9, 4, 7, 8, 9, 7, 8, 9}, 3, {}, rng, draft, q).ok());
  EXPECT_EQ(draft, (std::vector<int32_t>{7, 8, 9}));
  ASSERT_EQ(q.size(), 3u);
  EXPECT_TRUE(q[0].empty()) << "a lookup is a token with probability 1";
  // No 3-gram or 2-gram match; the 1-gram 5 occurred at 1, followed by 6 2.
  ASSERT_TRUE(d->propose({4, 5, 6, 2, 5}, 4, {}, rng, draft, q).ok());
  EXPECT_EQ(draft, (std::vector<int32_t>{6, 2, 5}));
  ASSERT_TRUE(d->propose({1, 2, 3}, 4, {}, rng, draft, q).ok());
  EXPECT_TRUE(draft.empty());
}

TEST(Speculative, AcceptanceByHand) {
  std::mt19937_64 rng(5);
  const std::vector<float> a{0.1f, 0.7f, 0.2f}, b{0.6f, 0.1f, 0.3f}, c{0.0f, 0.0f, 1.0f};
  // Greedy: argmax 1, then 0: draft (1, 2) keeps 1 and corrects 2 to 0.
  Verdict v = speculative_accept({1, 2}, {{}, {}}, {a, b, c}, true, rng);
  EXPECT_EQ(v.accepted, 1);
  EXPECT_EQ(v.next, 0);
  // Everything kept: the next token is the argmax after the draft.
  v = speculative_accept({1, 0}, {{}, {}}, {a, b, c}, true, rng);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 2);
  // Sampling, a lookup draft of a token the target gives 0: always rejected, and the
  // replacement comes from p without it.
  const std::vector<float> p0{0.5f, 0.0f, 0.5f};
  for (int i = 0; i < 100; ++i) {
    v = speculative_accept({1}, {{}}, {p0, c}, false, rng);
    ASSERT_EQ(v.accepted, 0);
    ASSERT_NE(v.next, 1);
  }
  // q = p: always kept.
  for (int i = 0; i < 100; ++i) {
    v = speculative_accept({2}, {b}, {b, c}, false, rng);
    ASSERT_EQ(v.accepted, 1);
    ASSERT_EQ(v.next, 2);
  }
  // The distribution the sampler draws from: top-k 2 of softmax(logits) renormalized.
  SamplerConfig s;
  s.temperature = 1.0f;
  s.top_k = 2;
  const std::vector<float> d = sampling_distribution({0.0f, std::log(3.0f), -5.0f}, s);
  EXPECT_NEAR(d[0], 0.25f, 1e-6f);
  EXPECT_NEAR(d[1], 0.75f, 1e-6f);
  EXPECT_EQ(d[2], 0.0f);
}

// The rollback a verification does: rows written past the kept ones are forgotten and
// whole blocks past them go back, so the pool and the table are what they were.
TEST(Speculative, RollingBackADraftReturnsThePoolAndTheTableExactly) {
  auto be = make_cpu_backend(1);
  const KvShape shape{2, 2, 64};
  auto pool = be->create_kv_pool(KvPoolConfig{shape, {}, 16, 8});
  ASSERT_TRUE(pool.ok());
  auto cache = be->create_paged_kv_cache(kv_config_full(shape, {}), *pool);
  ASSERT_TRUE(cache.ok());
  KvCache& c = **cache;
  const auto write = [&](int T) {
    ASSERT_TRUE(c.begin(c.length(), T).ok());
    std::vector<float> rows(size_t(T) * 128, 0.5f);
    for (int l = 0; l < 2; ++l)
      ASSERT_TRUE(be->kv_write(c, l, Tensor{rows.data(), T, 128}, Tensor{rows.data(), T, 128},
                               c.length()).ok());
    ASSERT_TRUE(c.end().ok());
  };
  write(30);
  const std::vector<int32_t> table = c.blocks();
  const KvPoolCounts counts = (*pool)->counts();
  const uint64_t bytes = c.bytes_used();
  write(5);  // a draft of 4 and the last token, crossing into a third block
  EXPECT_EQ(c.blocks().size(), 3u);
  ASSERT_TRUE(c.truncate(30).ok());  // none kept
  EXPECT_EQ(c.blocks(), table);
  EXPECT_EQ((*pool)->counts().used, counts.used);
  EXPECT_EQ((*pool)->counts().free, counts.free);
  EXPECT_EQ(c.bytes_used(), bytes);
  EXPECT_TRUE((*pool)->check({&c.blocks()}).ok());
}

// --- Greedy exactness on the built-in models.

template <class File>
class SpeculativeGreedy : public ModelTest<File> {
 protected:
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
    std::vector<uint64_t> kv_bytes;
    std::vector<int> processed;  // tokens through the step's forward (0: from the queue)
    Session::SpeculationStats stats;
  };
  static Run run(const SpeculativeConfig* spec) {
    SessionConfig c = ModelTest<File>::config(CacheMode::Cache, 64);
    c.stop_at_eos = false;
    auto s = ModelTest<File>::session(c);
    Run r;
    EXPECT_TRUE(s);
    if (!s) return r;
    if (spec) {
      std::shared_ptr<const Model> draft;
      std::unique_ptr<Backend> draft_be;
      if (spec->kind == DraftKind::Model) {
        draft = ModelTest<File>::model_;  // the model drafting for itself: every draft kept
        draft_be = make_cpu_backend(2);
      }
      Status st = s->set_speculation(*spec, draft, std::move(draft_be));
      EXPECT_TRUE(st.ok()) << st.message();
    }
    EXPECT_TRUE(s->reset({"def fibonacci(n):\n    if n < 2:\n        return n\n    return "
                          "fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef",
                          false})
                    .ok());
    while (!s->done()) {
      auto t = s->step();
      EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
      if (!t.ok()) break;
      r.tokens.push_back(t->token_id);
      r.logits.push_back(s->last_logits());
      r.kv_bytes.push_back(t->kv_bytes);
      r.processed.push_back(t->tokens_processed);
    }
    r.stats = s->speculation_stats();
    return r;
  }
  static void check_drafters(int early_exit_layers) {
    const Run plain = run(nullptr);
    ASSERT_EQ(plain.tokens.size(), 64u);
    SpeculativeConfig ngram, exit, self;
    ngram.kind = DraftKind::Ngram;
    exit.kind = DraftKind::EarlyExit;
    exit.layers = early_exit_layers;
    self.kind = DraftKind::Model;
    for (const SpeculativeConfig* spec : {&ngram, &exit, &self}) {
      SCOPED_TRACE(speculative_name(*spec));
      const Run r = run(spec);
      ASSERT_EQ(r.tokens, plain.tokens);
      for (size_t i = 0; i < plain.logits.size(); ++i) {
        ASSERT_EQ(r.logits[i].size(), plain.logits[i].size());
        EXPECT_EQ(std::memcmp(r.logits[i].data(), plain.logits[i].data(),
                              plain.logits[i].size() * sizeof(float)),
                  0)
            << "the logits of token " << i << " differ from plain decoding's";
        // The last token a verification kept leaves the cache as plain decoding does:
        // the rolled-back rows hold no block (before it, the cache already holds the
        // kept tokens not emitted yet).
        if (i + 1 == plain.logits.size() || r.processed[i + 1] > 0) {
          EXPECT_EQ(r.kv_bytes[i], plain.kv_bytes[i]) << "KV_CACHE after token " << i;
        }
      }
      EXPECT_GT(r.stats.verify_forwards, 0u);
      EXPECT_GT(r.stats.drafted, 0u);
      if (spec == &self) {
        EXPECT_EQ(r.stats.accepted, r.stats.drafted) << "a model agrees with itself";
        EXPECT_LT(r.stats.verify_forwards, 20u) << "4 drafted tokens kept per forward";
      }
      if (spec == &ngram) {
        EXPECT_GT(r.stats.accepted, 0u) << "code repeats its identifiers";
      }
    }
  }
};

using SpeculativeGreedyDefault = SpeculativeGreedy<DefaultModelFile>;
using SpeculativeGreedyGemma = SpeculativeGreedy<GemmaModelFile>;

TEST_F(SpeculativeGreedyDefault, EveryDrafterGivesPlainGreedysTokensAndLogits) {
  check_drafters(10);
}

// Gemma 3's local layers give blocks back as the window moves: a verification holds them
// until its rollback is done.
TEST_F(SpeculativeGreedyGemma, EveryDrafterGivesPlainGreedysTokensAndLogits) {
  check_drafters(6);
}

// --- Sampling keeps the target distribution.

// The chi-square statistic of `counts` against the distribution `p` (categories with an
// expected count under 5 are pooled), its degrees of freedom in *df.
double chi_square(const std::map<int32_t, int>& counts, const std::vector<float>& p, int n,
                  int* df) {
  double stat = 0, pooled_expected = 0, pooled_observed = 0;
  *df = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = double(p[i]) * n;
    const auto it = counts.find(int32_t(i));
    const double o = it == counts.end() ? 0 : it->second;
    if (e < 5) {
      pooled_expected += e;
      pooled_observed += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++*df;
  }
  if (pooled_expected > 0) {
    stat += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) /
            std::max(pooled_expected, 1e-9);
    ++*df;
  }
  return stat;
}

// The chi-square quantile at 1 - 0.001 (Wilson-Hilferty; within 1% for df >= 3).
double chi_square_critical(int df) {
  const double z = 3.0902, k = df;
  const double t = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * t * t * t;
}

TEST(SpeculativeSampling, VerifiedTokensFollowTheTargetDistributionNotTheDrafts) {
  test::TinyModelSpec spec;
  spec.n_layer = 3;
  spec.seed = 4;
  const std::string path =
      ::testing::TempDir() + "/kvscope_spec_tiny." + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::shared_ptr<const Model> model = std::move(m.value());
  SamplerConfig sc;
  sc.temperature = 1.0f;
  sc.top_k = 8;
  SessionConfig cfg;
  cfg.max_tokens = 4;
  cfg.stop_at_eos = false;
  const std::vector<int32_t> prompt{40, 41, 42, 43, 44};
  const int32_t x1 = 50;  // the first generated token, forced (the prefill step drafts nothing)
  // The target's and the early-exit draft's distributions for the next token, and the
  // target's after a given second token.
  auto target_after = [&](const std::vector<int32_t>& forced) {
    auto s = Session::create(model, make_cpu_backend(1), cfg);
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE((*s)->reset_tokens(prompt).ok());
    for (int32_t t : forced) EXPECT_TRUE((*s)->step_forced(t).ok());
    EXPECT_TRUE((*s)->step_forced(0).ok());  // its logits are those after `forced`
    return sampling_distribution((*s)->last_logits(), sc);
  };
  const std::vector<float> p2 = target_after({x1});

  auto s = Session::create(model, make_cpu_backend(1), cfg);
  ASSERT_TRUE(s.ok());
  SpeculativeConfig spec_cfg;
  spec_cfg.kind = DraftKind::EarlyExit;
  spec_cfg.layers = 1;
  spec_cfg.draft_max = 3;
  ASSERT_TRUE((*s)->set_speculation(spec_cfg).ok());
  const int kDraws = 3000;
  std::map<int32_t, int> second;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  int verified = 0;
  for (int i = 0; i < kDraws; ++i) {
    SamplerConfig si = sc;
    si.seed = uint64_t(i) + 1;
    (*s)->set_sampler(si);
    ASSERT_TRUE((*s)->reset_tokens(prompt).ok());
    ASSERT_TRUE((*s)->step_forced(x1).ok());
    auto t2 = (*s)->step();
    ASSERT_TRUE(t2.ok());
    verified += t2->accepted >= 0;
    auto t3 = (*s)->step();
    ASSERT_TRUE(t3.ok());
    ++second[t2->token_id];
    pairs.push_back({t2->token_id, t3->token_id});
  }
  EXPECT_EQ(verified, kDraws) << "every second token must come from a verification";
  int df = 0;
  const double stat = chi_square(second, p2, kDraws, &df);
  ASSERT_GE(df, 3);
  EXPECT_LT(stat, chi_square_critical(df)) << "df " << df;
  int32_t mode = std::max_element(second.begin(), second.end(), [](auto& a, auto& b) {
                   return a.second < b.second;
                 })->first;
  // The token after the most frequent second token, against the target given it.
  std::map<int32_t, int> third;
  int n3 = 0;
  for (const auto& [a, b] : pairs)
    if (a == mode) {
      ++third[b];
      ++n3;
    }
  const std::vector<float> p3 = target_after({x1, mode});
  int df3 = 0;
  const double stat3 = chi_square(third, p3, n3, &df3);
  ASSERT_GE(n3, 300);
  if (df3 >= 3) {
    EXPECT_LT(stat3, chi_square_critical(df3)) << "df " << df3 << ", n " << n3;
  }
  // The draft's distribution for the second token (the first layer of three, then the LM
  // head) differs enough that the same test rejects it.
  // q: the early exit's distribution after prompt + x1, read through a one-layer forward.
  auto be = make_cpu_backend(1);
  KvCacheConfig kc = kv_cache_config(*model, KvTypes{}, KvPolicy::Full);
  kc.shape.n_layer = 1;
  kc.layers.resize(1);
  auto pool = be->create_kv_pool(KvPoolConfig{kc.shape, kc.types, 16, 4});
  ASSERT_TRUE(pool.ok());
  auto cache = be->create_paged_kv_cache(kc, *pool);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> seq = prompt;
  seq.push_back(x1);
  ForwardOutput fo;
  ASSERT_TRUE(forward(*be, *model, seq.data(), int(seq.size()), 0, **cache, fo).ok());
  const std::vector<float> q2 = sampling_distribution(fo.logits, sc);
  double tv = 0;
  for (size_t i = 0; i < q2.size(); ++i) tv += std::fabs(q2[i] - p2[i]) / 2;
  EXPECT_GT(tv, 0.2) << "the draft must differ from the target for the test to mean much";
  int dfq = 0;
  EXPECT_GT(chi_square(second, q2, kDraws, &dfq), chi_square_critical(std::max(dfq, 3)));
}

TEST(Speculative, BadSettingsAreOneClearError) {
  EXPECT_FALSE(speculative_parse("lookahead").ok());
  EXPECT_FALSE(speculative_parse("early-exit:").ok());
  EXPECT_FALSE(speculative_parse("early-exit:x").ok());
  EXPECT_FALSE(speculative_parse("draft:").ok());
  EXPECT_EQ(speculative_parse("early-exit:3")->layers, 3);
  test::TinyModelSpec spec;
  const std::string path =
      ::testing::TempDir() + "/kvscope_spec_bad." + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto m = Model::load(path);
  ASSERT_TRUE(m.ok());
  std::shared_ptr<const Model> model = std::move(m.value());
  auto s = Session::create(model, make_cpu_backend(1), SessionConfig{});
  ASSERT_TRUE(s.ok());
  SpeculativeConfig c;
  c.kind = DraftKind::EarlyExit;
  c.layers = 99;
  Status st = (*s)->set_speculation(c);
  EXPECT_EQ(st.message(), "speculative: early-exit:99 is outside 1..1 (the model has 2 layers)");
  c.layers = 1;
  c.draft_max = 16;
  EXPECT_EQ((*s)->set_speculation(c).message(), "draft-max: 16 is outside 1..15");
  c.kind = DraftKind::Model;
  c.draft_max = 4;
  EXPECT_FALSE((*s)->set_speculation(c).ok()) << "a draft model needs the model";
}

// A draft model must share the target's vocabulary: SmolLM2's (49,152 tokens) is not
// Gemma 3's.
TEST_F(SpeculativeGreedyGemma, ADraftWithAnotherVocabularyIsRefused) {
  auto other = Model::load(KVSCOPE_DEFAULT_MODEL);
  if (!other.ok()) GTEST_SKIP() << "default model absent";
  SessionConfig c = config(CacheMode::Cache, 4);
  auto s = session(c);
  ASSERT_TRUE(s);
  SpeculativeConfig spec;
  spec.kind = DraftKind::Model;
  Status st = s->set_speculation(spec, std::move(other.value()), make_cpu_backend(1));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("must be the same vocabulary"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvscope
