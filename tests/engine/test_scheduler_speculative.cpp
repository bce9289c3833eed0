// test_scheduler_speculative.cpp — speculative decoding in the continuous-batching
// scheduler (SchedulerConfig::speculation) on the default model, against the same
// scheduler without it:
//   - greedy is exact for each drafter (ngram, early-exit:L, a draft model): several sequences at once
//     give the same tokens over 64 tokens, and the logits of the last token each step
//     emits are bit for bit those of plain decoding's same token (the CPU forward is
//     batch-invariant); drafts are accepted and rejected along the way;
//   - a rollback returns the pool exactly: after every step, the pool's used/free/cached
//     counts, the sequence's block table and which of its blocks are published equal the
//     plain run's at the same number of generated tokens;
//   - a pool too small for everyone (preemptions), penalties, a minimum length, stop ids
//     and a short context: still plain greedy's tokens and stop reasons;
//   - sampling with a seed: runs within max_tokens, is reproducible, and drafts;
//   - bad settings are one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "tests/util/model_fixture.h"
#include "tests/util/sanitizer.h"

namespace kvscope {
namespace {

// Code and text that repeat their identifiers (so the lookup drafter has something to
// propose and is right often, not always), and free text.
const char* const kPrompts[] = {
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\n\ndef",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the",
    "Once upon a time, in a small village by the sea,",
};
constexpr int kPromptCount = 4;

struct SpecRun {
  std::vector<std::vector<int32_t>> gen;  // per sequence
  std::vector<StopReason> stop;
  // Per sequence: generated-token index -> the logits last_logits() showed after the step
  // that emitted it as its last token.
  std::vector<std::map<int, std::vector<float>>> logits;
  // Per sequence: generated count -> (pool counts, table, published flags) after the step.
  struct PoolAt {
    KvPoolCounts counts;
    std::vector<int32_t> table;
    std::vector<bool> published;
  };
  std::vector<std::map<int, PoolAt>> pool_at;
  SchedulerStats stats;
  int rollbacks = 0, steps_with_rollback_compared = 0;
};

bool same_counts(const KvPoolCounts& a, const KvPoolCounts& b) {
  return a.used == b.used && a.free == b.free && a.cached == b.cached && a.total == b.total;
}

class SchedulerSpeculative : public ModelTest<DefaultModelFile> {
 protected:
  static SchedulerConfig config() {
    SchedulerConfig c;
    c.stop_at_eos = false;
    c.context = 512;
    c.pool_blocks = 160;
    c.max_batch_tokens = 64;
    return c;
  }
  static SpeculativeConfig spec(DraftKind kind, int layers = 0, int draft_max = 4) {
    SpeculativeConfig s;
    s.kind = kind;
    s.layers = layers;
    s.draft_max = draft_max;
    return s;
  }
  // The requests run to the end; the pool checked after every step and, with `plain`
  // given (a run of the same requests without speculation, one sequence), compared.
  static SpecRun run(const SchedulerConfig& c, const std::vector<Request>& reqs,
                     const SpecRun* plain = nullptr) {
    SpecRun r;
    auto be = make_cpu_backend(2);
    std::shared_ptr<Model> draft;  // draft:PATH: the same file, loaded as a model of its own
    if (c.speculation.kind == DraftKind::Model) {
      auto m = Model::load(DefaultModelFile::path());
      EXPECT_TRUE(m.ok());
      if (!m.ok()) return r;
      draft = std::move(*m);
    }
    auto made = Scheduler::create(model_, *be, c, draft, draft ? make_cpu_backend(2) : nullptr);
    EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
    if (!made.ok()) return r;
    Scheduler& s = **made;
    for (const Request& q : reqs) {
      auto id = s.add(q);
      EXPECT_TRUE(id.ok()) << (id.ok() ? "" : id.error().message);
      if (!id.ok()) return r;
    }
    const size_t n = size_t(s.size());
    r.logits.resize(n);
    r.pool_at.resize(n);
    for (int guard = 0; !s.idle() && guard < 10000; ++guard) {
      auto st = s.step();
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
      if (!st.ok()) break;
      Status ck = s.check();
      EXPECT_TRUE(ck.ok()) << "after step " << st->step << ": " << ck.message();
      if (!ck.ok()) break;
      EXPECT_LE(st->batch_tokens, c.max_batch_tokens);
      bool rolled = false;
      for (const SchedEvent& e : st->events) rolled |= e.kind == EventKind::Rollback;
      r.rollbacks += rolled;
      for (const StepRow& row : st->rows) {
        if (row.token_id < 0) continue;
        EXPECT_EQ(row.token_id, row.tokens_out.back());
        // All the kept tokens and the one after them, unless a stop condition ended it.
        const int kept = row.drafted.empty() ? 1 : row.accepted + 1;
        if (s.state(row.seq) == SeqState::Running)
          EXPECT_EQ(int(row.tokens_out.size()), kept);
        else
          EXPECT_LE(int(row.tokens_out.size()), kept);
        if (!row.drafted.empty()) {
          EXPECT_EQ(row.tokens, int(row.drafted.size()) + 1);
          EXPECT_LE(row.accepted, int(row.drafted.size()));
        }
        const size_t i = size_t(row.seq);
        const int g = int(s.generated(row.seq).size());
        r.logits[i][g - 1] = s.last_logits(row.seq);
        if (s.state(row.seq) != SeqState::Running) continue;
        SpecRun::PoolAt at{s.pool().counts(), row.table, {}};
        for (int32_t b : row.table) at.published.push_back(s.pool().published(b));
        if (plain && n == 1) {
          auto want = plain->pool_at[i].find(g);
          EXPECT_NE(want, plain->pool_at[i].end()) << "no plain step at " << g << " tokens";
          if (want != plain->pool_at[i].end()) {
            EXPECT_TRUE(same_counts(at.counts, want->second.counts))
                << "pool counts after " << g << " tokens: used " << at.counts.used << " free "
                << at.counts.free << " cached " << at.counts.cached << ", plain: used "
                << want->second.counts.used << " free " << want->second.counts.free << " cached "
                << want->second.counts.cached;
            EXPECT_EQ(at.table, want->second.table) << "block table after " << g << " tokens";
            EXPECT_EQ(at.published, want->second.published)
                << "published blocks after " << g << " tokens";
            r.steps_with_rollback_compared += rolled;
          }
        }
        r.pool_at[i][g] = std::move(at);
      }
    }
    EXPECT_TRUE(s.idle());
    EXPECT_EQ(s.pool().counts().used, 0) << "no block leaks";
    for (size_t i = 0; i < n; ++i) {
      r.gen.push_back(s.generated(int(i)));
      r.stop.push_back(s.stop_reason(int(i)));
    }
    r.stats = s.stats();
    return r;
  }
  static std::vector<Request> requests(int max_tokens, int count = kPromptCount) {
    std::vector<Request> out;
    for (int i = 0; i < count; ++i) {
      Request q;
      q.prompt = tokens(kPrompts[i]);
      q.max_tokens = max_tokens;
      out.push_back(q);
    }
    return out;
  }
  // Tokens equal; for each token the speculative run shows logits for, those of plain.
  static void expect_exact(const SpecRun& plain, const SpecRun& r) {
    ASSERT_EQ(r.gen.size(), plain.gen.size());
    for (size_t i = 0; i < plain.gen.size(); ++i) {
      EXPECT_EQ(r.gen[i], plain.gen[i]) << "sequence " << i;
      EXPECT_EQ(r.stop[i], plain.stop[i]) << "sequence " << i;
      for (const auto& [g, logits] : r.logits[i]) {
        auto want = plain.logits[i].find(g);
        ASSERT_NE(want, plain.logits[i].end());
        ASSERT_EQ(logits.size(), want->second.size());
        EXPECT_EQ(std::memcmp(logits.data(), want->second.data(), logits.size() * sizeof(float)), 0)
            << "sequence " << i << ": the logits of token " << g << " differ from plain's";
      }
    }
  }
};

TEST_F(SchedulerSpeculative, GreedyGivesPlainGreedysTokensAndLogitsForEachDrafter) {
  const auto reqs = requests(64);
  const SpecRun plain = run(config(), reqs);
  for (size_t i = 0; i < plain.gen.size(); ++i) ASSERT_EQ(plain.gen[i].size(), 64u);
  for (const SpeculativeConfig& sp : {spec(DraftKind::Ngram), spec(DraftKind::EarlyExit, 12)}) {
    SCOPED_TRACE(speculative_name(sp));
    SchedulerConfig c = config();
    c.speculation = sp;
    const SpecRun r = run(c, reqs);
    expect_exact(plain, r);
    EXPECT_GT(r.stats.drafted, 0u);
    EXPECT_GT(r.stats.accepted, 0u) << "repeated identifiers are drafted right";
    EXPECT_LT(r.stats.accepted, r.stats.drafted) << "and some drafts are wrong";
    EXPECT_GT(r.rollbacks, 0);
    EXPECT_GT(r.stats.decode_row_tokens, r.stats.decode_rows) << "several tokens per forward";
    EXPECT_LT(r.stats.steps, plain.stats.steps) << "fewer steps than tokens";
    EXPECT_EQ(r.stats.decode_tokens, plain.stats.decode_tokens);
  }
  // A draft model (draft:PATH): here the model itself, loaded again, so at temperature 0
  // it drafts exactly what the target then picks: every draft is kept.
  SchedulerConfig c = config();
  c.speculation = spec(DraftKind::Model);
  c.speculation.draft_path = DefaultModelFile::path();
  const SpecRun r = run(c, reqs);
  expect_exact(plain, r);
  EXPECT_GT(r.stats.drafted, 0u);
  EXPECT_EQ(r.stats.accepted, r.stats.drafted);
  EXPECT_EQ(r.rollbacks, 0);
  EXPECT_LT(r.stats.steps, plain.stats.steps / 3);
}

// One sequence, so its blocks come from the pool in the same order as plain decoding's:
// after each step the pool and its table are what plain decoding has at that many tokens.
TEST_F(SchedulerSpeculative, ARollbackReturnsThePoolExactly) {
  for (int block : {8, 16}) {
    SCOPED_TRACE("block size " + std::to_string(block));
    SchedulerConfig c = config();
    c.block_size = block;
    c.pool_blocks = 64;
    const auto reqs = requests(96, 1);
    const SpecRun plain = run(c, reqs);
    c.speculation = spec(DraftKind::Ngram, 0, 8);
    const SpecRun r = run(c, reqs, &plain);
    expect_exact(plain, r);
    EXPECT_GT(r.steps_with_rollback_compared, 3) << "steps with a rejected draft compared";
  }
}

// A pool too small for everyone: drafts take only free blocks, sequences are preempted
// and recomputed, and every sequence still writes plain greedy's tokens.
TEST_F(SchedulerSpeculative, ASmallPoolPreemptsAndStaysExact) {
  SchedulerConfig c = config();
  c.block_size = 8;
  c.pool_blocks = 12;
  const auto reqs = requests(24);
  const SpecRun plain = run(c, reqs);
  c.speculation = spec(DraftKind::Ngram, 0, 6);
  const SpecRun r = run(c, reqs);
  expect_exact(plain, r);
  EXPECT_GT(r.stats.preemptions, 0);
  EXPECT_GT(r.stats.accepted, 0u);
}

// Penalties (shaped per position with the draft before it), a minimum length holding
// back the stop ids, stop ids, and a context that ends a sequence: plain greedy's tokens
// and stop reasons.
TEST_F(SchedulerSpeculative, PenaltiesMinimumLengthStopsAndContextStayExact) {
  auto reqs = requests(64);
  reqs[0].sampler.penalties.repeat = 1.3f;
  reqs[1].sampler.penalties.frequency = 0.5f;
  reqs[1].sampler.penalties.presence = 0.3f;
  const std::vector<int32_t> probe = run(config(), {reqs[2]}).gen[0];
  ASSERT_GE(probe.size(), 20u);
  // A token first generated at 12 or later: held back for 10 tokens (nothing changes),
  // then it stops the sequence.
  size_t at = 12;
  while (at < probe.size() &&
         std::find(probe.begin(), probe.begin() + 12, probe[at]) != probe.begin() + 12)
    ++at;
  ASSERT_LT(at, probe.size());
  reqs[2].stop_ids = {probe[at]};
  reqs[2].min_tokens = 10;
  reqs[3].max_tokens = 500;  // the context ends it
  SchedulerConfig c = config();
  c.context = int(reqs[3].prompt.size()) + 40;
  const SpecRun plain = run(c, reqs);
  EXPECT_EQ(plain.stop[2], StopReason::StopToken);
  EXPECT_EQ(plain.stop[3], StopReason::ContextFull);
  c.speculation = spec(DraftKind::Ngram, 0, 6);
  const SpecRun r = run(c, reqs);
  expect_exact(plain, r);
  EXPECT_GT(r.stats.accepted, 0u);
}

// Sampling: Leviathan's rule with each sequence's own generator; no claim of equality with
// plain sampling (test_speculative.cpp checks the distribution), but the run is bounded,
// drafts, and the same seed gives the same tokens. (16 tokens under AddressSanitizer: the
// same code, at half the cost; the release stage runs 32.)
TEST_F(SchedulerSpeculative, SamplingWithASeedIsBoundedAndReproducible) {
  const int n_tokens = test::kAddressSanitizer ? 16 : 32;
  auto reqs = requests(n_tokens, 3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].sampler.temperature = 0.8f;
    reqs[i].sampler.top_k = 40;
    reqs[i].sampler.seed = 7 + i;
  }
  reqs[1].n = 2;
  for (const SpeculativeConfig& sp : {spec(DraftKind::Ngram), spec(DraftKind::EarlyExit, 12)}) {
    SCOPED_TRACE(speculative_name(sp));
    SchedulerConfig c = config();
    c.speculation = sp;
    const SpecRun a = run(c, reqs), b = run(c, reqs);
    ASSERT_EQ(a.gen.size(), reqs.size() + 1);
    for (size_t i = 0; i < a.gen.size(); ++i) {
      EXPECT_EQ(a.gen[i].size(), size_t(n_tokens)) << "sequence " << i;
      EXPECT_EQ(a.stop[i], StopReason::MaxTokens);
      EXPECT_EQ(a.gen[i], b.gen[i]) << "sequence " << i << ": the same seed, other tokens";
    }
    EXPECT_GT(a.stats.drafted, 0u);
    EXPECT_LE(a.stats.accepted, a.stats.drafted);
  }
}

TEST_F(SchedulerSpeculative, BadSettingsAreOneClearError) {
  auto be = make_cpu_backend(1);
  SchedulerConfig c = config();
  c.speculation = spec(DraftKind::Ngram, 0, 16);
  auto s = Scheduler::create(model_, *be, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("1..15"), std::string::npos) << s.error().message;
  c.speculation = spec(DraftKind::EarlyExit, model_->config().n_layer);
  s = Scheduler::create(model_, *be, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("early-exit"), std::string::npos) << s.error().message;
  c.speculation = spec(DraftKind::Model);
  c.speculation.draft_path = "x.gguf";
  s = Scheduler::create(model_, *be, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("needs the draft model"), std::string::npos) << s.error().message;
  // A draft model of another vocabulary.
  if (std::filesystem::exists(GemmaModelFile::path())) {
    auto gemma = Model::load(GemmaModelFile::path());
    ASSERT_TRUE(gemma.ok());
    s = Scheduler::create(model_, *be, c, std::shared_ptr<Model>(std::move(*gemma)),
                          make_cpu_backend(1));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("same vocabulary"), std::string::npos) << s.error().message;
  }
}

}  // namespace
}  // namespace kvscope
