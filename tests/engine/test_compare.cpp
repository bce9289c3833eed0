// test_compare.cpp — teacher forcing and the lockstep comparison on the default model:
// forced tokens are the ones appended and the forced session predicts from them; KL is
// right on hand-worked distributions; identical configurations report KL 0, full top-1
// agreement and no attention difference; an f32 cache against the f16 reference
// reports a small nonzero KL; a context size is enforced.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/compare.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/util/model_fixture.h"

namespace kvscope {
namespace {

class CompareTest : public ModelTest<DefaultModelFile> {
 protected:
  static std::unique_ptr<Session> make(SessionConfig cfg) {
    return session(cfg);
  }
  static SessionConfig config(KvDtype t, int max_tokens) {
    SessionConfig c;
    c.kv_types = {t, t};
    c.max_tokens = max_tokens;
    c.stop_at_eos = false;
    return c;
  }
};

const PromptSpec kPrompt{"The old lighthouse keeper climbed the stairs and", false};

TEST(KlDivergence, HandWorkedDistributions) {
  // p = (1/2, 1/2), q = (3/4, 1/4): KL(p||q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3).
  EXPECT_NEAR(kl_divergence_logits({0.0f, 0.0f}, {std::log(3.0f), 0.0f}), 0.5 * std::log(4.0 / 3.0),
              1e-7);
  // Reversed: KL(q||p) = 3/4 ln(3/2) + 1/4 ln(1/2).
  EXPECT_NEAR(kl_divergence_logits({std::log(3.0f), 0.0f}, {0.0f, 0.0f}),
              0.75 * std::log(1.5) + 0.25 * std::log(0.5), 1e-7);
  // A shift of every logit changes nothing.
  EXPECT_EQ(kl_divergence_logits({1.0f, 2.0f, 3.0f}, {1.0f, 2.0f, 3.0f}), 0.0);
  EXPECT_NEAR(kl_divergence_logits({1.0f, 2.0f, 3.0f}, {11.0f, 12.0f, 13.0f}), 0.0, 1e-6);
}

TEST_F(CompareTest, ForcedTokensAreAppendedAndSteerTheContinuation) {
  auto free_run = make(config(KvDtype::F16, 6));
  auto forced = make(config(KvDtype::F16, 6));
  ASSERT_TRUE(free_run->reset(kPrompt).ok());
  ASSERT_TRUE(forced->reset(kPrompt).ok());
  auto a = free_run->step();
  ASSERT_TRUE(a.ok());
  // Force the model's second choice instead of its first.
  const int32_t second = a->top[1].id;
  auto b = forced->step_forced(second);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->token_id, second);
  EXPECT_EQ(b->sampled_rank, 1);
  EXPECT_EQ(forced->tokens().back(), second);
  // Same prompt, same distribution: the forced step saw exactly what the free one did.
  EXPECT_EQ(free_run->last_logits(), forced->last_logits());
  // The next prediction comes from the forced token, so it differs.
  ASSERT_TRUE(free_run->step().ok());
  ASSERT_TRUE(forced->step().ok());
  EXPECT_NE(free_run->last_logits(), forced->last_logits());
  EXPECT_FALSE(forced->step_forced(model_->config().n_vocab).ok());
  EXPECT_FALSE(forced->step_forced(-1).ok());
}

TEST_F(CompareTest, IdenticalConfigurationsAgreeExactly) {
  auto cmp = Comparison::create(make(config(KvDtype::F16, 16)), make(config(KvDtype::F16, 16)));
  ASSERT_TRUE(cmp.ok());
  ASSERT_TRUE((*cmp)->reset(kPrompt).ok());
  while (!(*cmp)->done()) {
    auto s = (*cmp)->step();
    ASSERT_TRUE(s.ok()) << s.error().message;
    EXPECT_EQ(s->kl, 0.0) << "step " << s->step;
    EXPECT_TRUE(s->top1_agree);
    EXPECT_EQ(s->max_attn_diff, 0.0f);
    EXPECT_EQ(s->cand_kv_bytes, s->ref_kv_bytes);
    EXPECT_EQ(s->reference.token_id, s->token);
  }
  const CompareSummary& sum = (*cmp)->summary();
  EXPECT_EQ(sum.steps, 16);
  EXPECT_EQ(sum.top1_agreements, 16);
  EXPECT_EQ(sum.mean_kl, 0.0);
  EXPECT_EQ((*cmp)->candidate().tokens(), (*cmp)->reference().tokens());
}

TEST_F(CompareTest, F32CacheAgainstF16ReferenceHasSmallPositiveKl) {
  auto cmp = Comparison::create(make(config(KvDtype::F32, 12)), make(config(KvDtype::F16, 12)));
  ASSERT_TRUE(cmp.ok());
  ASSERT_TRUE((*cmp)->reset(kPrompt).ok());
  while (!(*cmp)->done()) ASSERT_TRUE((*cmp)->step().ok());
  const CompareSummary& sum = (*cmp)->summary();
  // fp16 rounding of K/V moves the distributions a little, never a lot.
  EXPECT_GT(sum.mean_kl, 0.0);
  EXPECT_LT(sum.max_kl, 1e-3);
  EXPECT_GT(sum.max_attn_diff, 0.0f);
  EXPECT_LT(sum.max_attn_diff, 0.02f);
  EXPECT_EQ(sum.cand_kv_bytes, 2 * sum.ref_kv_bytes);  // f32 holds twice the bytes
  // Teacher forcing: the reference followed the candidate's tokens.
  EXPECT_EQ((*cmp)->candidate().tokens(), (*cmp)->reference().tokens());
}

TEST_F(CompareTest, ContextSizeStopsGenerationAndIsChecked) {
  SessionConfig c = config(KvDtype::F16, 100);
  c.limits.n_ctx = 16;
  auto s = make(c);
  ASSERT_TRUE(s->reset(kPrompt).ok());
  EXPECT_EQ(s->context_limit(), 16);
  int steps = 0;
  while (!s->done()) {
    auto tr = s->step();
    ASSERT_TRUE(tr.ok());
    EXPECT_LE(tr->seq_len, 16);
    ++steps;
  }
  EXPECT_EQ(s->stop_reason(), StopReason::ContextFull);
  EXPECT_EQ(int(s->tokens().size()), 16);
  EXPECT_EQ(steps, 16 - s->prompt_len());
  // A prompt that does not fit the context, and sizes outside [2, trained], are errors.
  c.limits.n_ctx = 8;
  auto small = make(c);
  Status st = small->reset(kPrompt);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("context holds 8"), std::string::npos) << st.message();
  for (int bad : {1, -3, model_->config().n_ctx + 1}) {
    c.limits.n_ctx = bad;
    auto e = Session::create(model_, make_cpu_backend(1), c);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().message.find("ctx"), std::string::npos) << e.error().message;
  }
}

}  // namespace
}  // namespace kvscope
