// test_session.cpp — the generation loop on the default model: KV CACHE and NO CACHE give
// the same tokens and logits, the work counters equal closed-form formulas (including
// the waste formula g·p + g(g−1)/2 versus p + g − 1), mode switches mid-run,
// seeded sampling, stop conditions and bad prompts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/session.h"
#include "tests/util/model_fixture.h"

namespace kvscope {
namespace {

class SessionTest : public ModelTest<DefaultModelFile> {
 protected:
  std::unique_ptr<Session> make(CacheMode mode, int max_tokens) {
    return session(config(mode, max_tokens));
  }
};

const PromptSpec kPrompt{"The old lighthouse keeper climbed the stairs and", false};

// Closed-form FLOPs of one forward over T tokens after pos0 cached positions, written out
// from the model's shapes independently of forward_flops().
uint64_t expected_flops(const ModelConfig& c, uint64_t T, uint64_t pos0) {
  const uint64_t C = c.n_embd, D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv, F = c.n_ff,
                 L = c.n_layer, V = c.n_vocab;
  const uint64_t per_token = L * (C * H * D + 2 * C * Hkv * D + H * D * C + 3 * C * F);
  // Query t (0-based) sees pos0 + t + 1 keys: sum = T*pos0 + T(T+1)/2.
  const uint64_t keys = T * pos0 + T * (T + 1) / 2;
  return 2 * (T * per_token + C * V + keys * L * H * 2 * D);
}

TEST_F(SessionTest, CacheAndNoCacheGiveIdenticalTokensAndLogits) {
  auto a = make(CacheMode::Cache, 64);
  auto b = make(CacheMode::NoCache, 64);
  ASSERT_TRUE(a->reset(kPrompt).ok());
  ASSERT_TRUE(b->reset(kPrompt).ok());
  float worst = 0;
  for (int i = 0; i < 64; ++i) {
    auto ta = a->step();
    auto tb = b->step();
    ASSERT_TRUE(ta.ok() && tb.ok());
    ASSERT_EQ(ta->token_id, tb->token_id) << "step " << i;
    const auto& la = a->last_logits();
    const auto& lb = b->last_logits();
    for (size_t v = 0; v < la.size(); ++v) worst = std::max(worst, std::fabs(la[v] - lb[v]));
    // Attention rows of the newest query agree too.
    ASSERT_EQ(ta->attention.size(), tb->attention.size());
    for (size_t j = 0; j < ta->attention.size(); ++j)
      ASSERT_NEAR(ta->attention[j], tb->attention[j], 1e-5f);
  }
  // Same arithmetic per token whatever the batch: the logits agree to within 1e-3.
  EXPECT_LT(worst, 1e-3f);
  EXPECT_EQ(a->tokens(), b->tokens());
}

TEST_F(SessionTest, CountersFollowTheClosedForms) {
  const ModelConfig& c = model_->config();
  const int g = 12;
  auto a = make(CacheMode::Cache, g);
  auto b = make(CacheMode::NoCache, g);
  ASSERT_TRUE(a->reset(kPrompt).ok());
  ASSERT_TRUE(b->reset(kPrompt).ok());
  const uint64_t p = a->prompt_len(), L = c.n_layer;
  const uint64_t bytes_per_token = uint64_t(L) * 2 * c.n_head_kv * c.head_dim * 2;  // f16
  uint64_t total_a = 0, total_b = 0;
  for (int t = 1; t <= g; ++t) {
    auto ta = a->step();
    auto tb = b->step();
    ASSERT_TRUE(ta.ok() && tb.ok());
    // CACHE: step 1 processes the prompt, later steps one token against p+t-2 cached.
    const uint64_t Ta = t == 1 ? p : 1, pos_a = t == 1 ? 0 : p + t - 2;
    EXPECT_EQ(ta->tokens_processed, int(Ta));
    EXPECT_EQ(ta->flops, expected_flops(c, Ta, pos_a)) << "step " << t;
    EXPECT_EQ(ta->kv_rows, Ta * L);
    // KV_CACHE: the blocks of 16 positions that hold the p + t - 1 positions.
    EXPECT_EQ(ta->kv_bytes, (p + t - 1 + 15) / 16 * 16 * bytes_per_token);
    EXPECT_EQ(ta->kv_transient_bytes, 0u);
    // NO CACHE: every step recomputes the whole sequence, p + t - 1 tokens.
    const uint64_t Tb = p + t - 1;
    EXPECT_EQ(tb->tokens_processed, int(Tb));
    EXPECT_EQ(tb->flops, expected_flops(c, Tb, 0)) << "step " << t;
    EXPECT_EQ(tb->kv_rows, Tb * L);
    EXPECT_EQ(tb->kv_bytes, 0u);
    EXPECT_EQ(tb->kv_transient_bytes, Tb * bytes_per_token);
    EXPECT_EQ(ta->seq_len, int(p + t));
    EXPECT_EQ(tb->seq_len, int(p + t));
    total_a += ta->flops;
    total_b += tb->flops;
    EXPECT_EQ(ta->flops_total, total_a);
    EXPECT_EQ(tb->flops_total, total_b);
  }
  // The waste formula over the whole run, exactly.
  const uint64_t G = g;
  auto last_a = a->step();  // done: an error, the totals stay
  EXPECT_FALSE(last_a.ok());
  uint64_t rows_a = 0, rows_b = 0;
  {
    auto s1 = make(CacheMode::Cache, g), s2 = make(CacheMode::NoCache, g);
    ASSERT_TRUE(s1->reset(kPrompt).ok() && s2->reset(kPrompt).ok());
    while (!s1->done()) rows_a = s1->step()->kv_rows_total;
    while (!s2->done()) rows_b = s2->step()->kv_rows_total;
  }
  EXPECT_EQ(rows_a, (p + G - 1) * L);
  EXPECT_EQ(rows_b, (G * p + G * (G - 1) / 2) * L);
  // Matches the default model's published per-token figure: ~2.69e8 FLOPs at 0 keys.
  EXPECT_NEAR(double(expected_flops(c, 1, 0)), 2.69e8, 0.01e8);
}

TEST_F(SessionTest, SwitchingModesMidRunKeepsTheSameTokens) {
  auto ref = make(CacheMode::Cache, 24);
  auto sw = make(CacheMode::Cache, 24);
  ASSERT_TRUE(ref->reset(kPrompt).ok());
  ASSERT_TRUE(sw->reset(kPrompt).ok());
  for (int i = 0; i < 24; ++i) {
    if (i == 8) {
      ASSERT_TRUE(sw->set_mode(CacheMode::NoCache).ok());
    }
    if (i == 16) {
      ASSERT_TRUE(sw->set_mode(CacheMode::Cache).ok());
    }
    auto a = ref->step();
    auto b = sw->step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->token_id, b->token_id) << "step " << i;
    if (i == 8) {
      EXPECT_EQ(b->kv_bytes, 0u);  // NO CACHE frees the cache
    }
    if (i == 16) {
      // Back to CACHE: one prefill over the whole sequence rebuilds it.
      EXPECT_EQ(b->tokens_processed, b->seq_len - 1);
      EXPECT_GT(b->kv_bytes, 0u);
    }
    if (i == 17) {
      EXPECT_EQ(b->tokens_processed, 1);
    }
  }
}

TEST_F(SessionTest, SeededSamplingIsReproducibleAndSeedsDiffer) {
  auto run = [&](uint64_t seed) {
    auto s = make(CacheMode::Cache, 24);
    SamplerConfig sc;
    sc.temperature = 0.9f;
    sc.top_k = 40;
    sc.top_p = 0.95f;
    sc.seed = seed;
    s->set_sampler(sc);
    EXPECT_TRUE(s->reset(kPrompt).ok());
    while (!s->done()) EXPECT_TRUE(s->step().ok());
    return s->tokens();
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST_F(SessionTest, TraceCarriesAttentionCandidatesAndKvSummaries) {
  auto s = make(CacheMode::Cache, 3);
  ASSERT_TRUE(s->reset(kPrompt).ok());
  const ModelConfig& c = model_->config();
  auto t1 = s->step();
  ASSERT_TRUE(t1.ok());
  EXPECT_EQ(int(t1->prompt.size()), s->prompt_len());
  EXPECT_EQ(t1->n_attn, s->prompt_len());
  ASSERT_EQ(t1->attention.size(), size_t(c.n_layer) * c.n_head * t1->n_attn);
  // Each (layer, head) row is a probability distribution.
  for (int r = 0; r < c.n_layer * c.n_head; ++r) {
    double sum = 0;
    for (int j = 0; j < t1->n_attn; ++j) sum += t1->attention[size_t(r) * t1->n_attn + j];
    EXPECT_NEAR(sum, 1.0, 1e-4);
  }
  EXPECT_EQ(t1->kv_written, s->prompt_len());
  EXPECT_EQ(t1->k_norm.size(), size_t(c.n_layer) * t1->kv_written);
  for (float n : t1->k_norm) EXPECT_GT(n, 0.0f);
  ASSERT_FALSE(t1->top.empty());
  EXPECT_EQ(t1->sampled_rank, 0);  // greedy picks the best candidate
  EXPECT_EQ(t1->top[0].id, t1->token_id);
  for (size_t i = 1; i < t1->top.size(); ++i) EXPECT_LE(t1->top[i].p, t1->top[i - 1].p);
  auto t2 = s->step();
  ASSERT_TRUE(t2.ok());
  EXPECT_TRUE(t2->prompt.empty());
  EXPECT_EQ(t2->kv_first_pos, s->prompt_len());
  EXPECT_EQ(t2->kv_written, 1);
}

TEST_F(SessionTest, StopConditions) {
  auto s = make(CacheMode::Cache, 5);
  ASSERT_TRUE(s->reset(kPrompt).ok());
  int n = 0;
  while (!s->done()) {
    ASSERT_TRUE(s->step().ok());
    ++n;
  }
  EXPECT_EQ(n, 5);
  EXPECT_EQ(s->stop_reason(), StopReason::MaxTokens);

  // A stop string taken from the greedy continuation stops generation right there.
  auto g = make(CacheMode::Cache, 40);
  ASSERT_TRUE(g->reset(kPrompt).ok());
  while (!g->done()) ASSERT_TRUE(g->step().ok());
  const std::string text = g->generated_text();
  ASSERT_GE(text.size(), 12u);
  SessionConfig cfg;
  cfg.max_tokens = 40;
  cfg.stop_strings = {text.substr(6, 5)};
  auto st = Session::create(model_, make_cpu_backend(2), cfg);
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)->reset(kPrompt).ok());
  while (!(*st)->done()) ASSERT_TRUE((*st)->step().ok());
  EXPECT_EQ((*st)->stop_reason(), StopReason::StopString);
  EXPECT_LT((*st)->generated(), g->generated());

  // A chat answer ends with <|im_end|> (EOS) well before 200 tokens.
  SessionConfig chat_cfg;
  chat_cfg.max_tokens = 200;
  auto c = Session::create(model_, make_cpu_backend(2), chat_cfg);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->reset({"What is the capital of France?", true}).ok());
  while (!(*c)->done()) ASSERT_TRUE((*c)->step().ok());
  EXPECT_EQ((*c)->stop_reason(), StopReason::Eos);
}

TEST_F(SessionTest, BadPromptsAreClearErrors) {
  auto s = make(CacheMode::Cache, 4);
  Status empty = s->reset({"", false});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("empty"), std::string::npos);
  Status bad = s->reset({std::string("abc\xC3(def", 8), false});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("UTF-8"), std::string::npos);
  EXPECT_NE(bad.message().find("offset 3"), std::string::npos);
  std::string huge;
  for (int i = 0; i < 9000; ++i) huge += " word";
  Status big = s->reset({huge, false});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.message().find("context"), std::string::npos);
  // The session still works after rejected prompts.
  ASSERT_TRUE(s->reset(kPrompt).ok());
  EXPECT_TRUE(s->step().ok());
}

}  // namespace
}  // namespace kvscope
