// test_scheduler.cpp — continuous batching (engine/scheduler.h) against the same prompts
// run alone through a Session:
//   - the default model, eight prompts arriving at different steps under a small token
//     budget (chunked prefill): every sequence's tokens and last logits equal its solo
//     run's, bit for bit;
//   - a pool too small for everyone: sequences are preempted and recomputed, and still
//     finish with their solo tokens; no block leaks;
//   - prefix caching: a second prompt sharing two blocks with the first adopts them, and
//     prefills only the rest, with the same tokens and logits as a cold run;
//   - a randomized run on a tiny model (arrivals, cancels, small pools, block sizes,
//     budgets, sampling): the pool's invariants after every step, no leak, and every
//     finished sequence equal to its solo run;
//   - bad requests and configurations: clear errors, the scheduler still usable;
//   - stop conditions (a full context, a control token under stop_at_eos) as a solo run's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <random>
#include <sstream>
#include <tuple>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "tests/util/model_fixture.h"
#include "tests/util/sanitizer.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

// A prompt run alone through a Session (CACHE, every position held like the pool's
// caches): its generated tokens, the logits of its last step and why it stopped.
struct Solo {
  std::vector<int32_t> gen;
  std::vector<float> logits;
  StopReason stop = StopReason::None;
};

Solo run_solo(const std::shared_ptr<const Model>& model, const std::vector<int32_t>& prompt,
              int max_tokens, int context, bool stop_at_eos, const SamplerConfig& sampler = {},
              KvTypes kv_types = {}) {
  SessionConfig c;
  c.mode = CacheMode::Cache;
  c.kv_types = kv_types;
  c.kv_policy = KvPolicy::Full;
  c.limits.n_ctx = context;
  c.max_tokens = max_tokens;
  c.stop_at_eos = stop_at_eos;
  c.top_candidates = 1;
  Solo out;
  auto s = Session::create(model, make_cpu_backend(2), c);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  if (!s.ok()) return out;
  (*s)->set_sampler(sampler);
  Status st = (*s)->reset_tokens(prompt);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return out;
  while (!(*s)->done()) {
    auto tr = (*s)->step();
    EXPECT_TRUE(tr.ok()) << (tr.ok() ? "" : tr.error().message);
    if (!tr.ok()) return out;
    out.gen.push_back(tr->token_id);
  }
  out.logits = (*s)->last_logits();
  out.stop = (*s)->stop_reason();
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::ostringstream o;
  for (size_t i = 0; i < ids.size(); ++i) o << (i ? " " : "") << ids[i];
  return o.str();
}

// Steps the scheduler until nothing is left, checking the pool after every step and that
// no step exceeds the budget or the sequence limit; returns every step's trace.
std::vector<BatchStep> run_to_idle(Scheduler& s, int max_steps = 100000) {
  std::vector<BatchStep> steps;
  while (!s.idle()) {
    auto st = s.step();
    EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message);
    if (!st.ok()) break;
    Status c = s.check();
    EXPECT_TRUE(c.ok()) << "after step " << st->step << ": " << c.message();
    if (!c.ok()) break;
    EXPECT_LE(st->batch_tokens, s.config().max_batch_tokens);
    EXPECT_LE(st->running, s.config().max_seqs);
    steps.push_back(std::move(*st));
    if (int(steps.size()) >= max_steps) {
      ADD_FAILURE() << "still not idle after " << max_steps << " steps";
      break;
    }
  }
  return steps;
}

int count_events(const std::vector<BatchStep>& steps, EventKind k, int seq = -1) {
  int n = 0;
  for (const BatchStep& st : steps)
    for (const SchedEvent& e : st.events) n += e.kind == k && (seq < 0 || e.seq == seq);
  return n;
}

// --- The default model.

class SchedulerTest : public ModelTest<DefaultModelFile> {
 protected:
  // The solo run of a prompt on the model's full context, greedy, EOS not stopping it;
  // computed once per prompt and token count for the whole suite.
  static const Solo& solo(const std::vector<int32_t>& prompt, int max_tokens) {
    static std::map<std::pair<std::vector<int32_t>, int>, Solo> memo;
    auto key = std::make_pair(prompt, max_tokens);
    auto it = memo.find(key);
    if (it == memo.end())
      it = memo.emplace(key, run_solo(model_, prompt, max_tokens, model_->config().n_ctx, false))
               .first;
    return it->second;
  }
  static std::unique_ptr<Scheduler> make(const SchedulerConfig& c, Backend& be) {
    auto s = Scheduler::create(model_, be, c);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? std::move(*s) : nullptr;
  }
  static SchedulerConfig config() {
    SchedulerConfig c;
    c.stop_at_eos = false;
    c.pool_blocks = 128;
    return c;
  }
};

// Eight prompts of 1 to ~60 tokens, the longest over the 32-token budget.
const char* const kPrompts[] = {
    "Hi",
    "The old lighthouse keeper climbed the stairs and",
    "Once upon a time, in a small village by the sea, there lived a fisherman who every "
    "morning rowed out past the rocks before the sun had risen over the hills",
    "List three primary colours:",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The capital of France is",
    "In the beginning of the twentieth century, physicists discovered that light behaves "
    "both as a wave and as a particle, an idea that changed how we think about matter, "
    "energy and the very nature of observation itself. This",
    "Water boils at",
};

// Parallel sampling: 4 samples of one prompt fork off its computed blocks. Right after the
// fork every prompt block has 4 references and the prompt went through the forward once;
// each sample's first write into the shared, partly filled last block copies it while
// another still shares it (3 copies, and none after), and every sample equals the same
// prompt run alone with its seed (tokens, and the last logits bit for bit).
TEST_F(SchedulerTest, ParallelSamplesShareThePromptBlocksAndCopyOnlyThePartialOne) {
  const int kMax = 8, kN = 4;
  auto be = make_cpu_backend(2);
  auto s = make(config(), *be);
  ASSERT_TRUE(s);
  const auto prompt = tokens(kPrompts[2]);
  ASSERT_NE(prompt.size() % 16, 0u) << "the last prompt block must be partly filled";
  Request r;
  r.prompt = prompt;
  r.max_tokens = kMax;
  r.n = kN;
  r.sampler.temperature = 0.9f;
  r.sampler.seed = 42;
  auto id = s->add(r);
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(*id, 0);
  EXPECT_EQ(s->size(), kN);
  auto st = s->step();
  ASSERT_TRUE(st.ok()) << st.error().message;
  ASSERT_TRUE(s->check().ok());
  EXPECT_EQ(st->batch_tokens, int(prompt.size())) << "the prompt is computed once";
  EXPECT_EQ(count_events({*st}, EventKind::Fork), kN - 1);
  ASSERT_EQ(st->rows.size(), size_t(kN));
  const std::vector<int32_t> table = st->rows[0].table;
  ASSERT_EQ(int(table.size()), kv_blocks_for(int(prompt.size()), 16));
  for (const StepRow& row : st->rows) {
    EXPECT_GE(row.token_id, 0) << "every sample has its first token";
    EXPECT_EQ(row.table, table) << "sample " << row.seq;
  }
  for (int32_t b : table) EXPECT_EQ(s->pool().ref_count(b), kN) << "block " << b;
  EXPECT_EQ(s->pool().counts().used, int(table.size()));
  // The next step writes each sample's first token into the shared last block.
  st = s->step();
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(s->check().ok());
  int cows = 0;
  for (const SchedEvent& e : st->events) cows += e.kind == EventKind::Cow ? e.n : 0;
  EXPECT_EQ(cows, kN - 1);
  std::set<int32_t> last;
  for (const StepRow& row : st->rows) {
    for (size_t i = 0; i + 1 < table.size(); ++i) EXPECT_EQ(row.table[i], table[i]);
    last.insert(row.table[table.size() - 1]);
  }
  EXPECT_EQ(int(last.size()), kN) << "each sample has its own last block";
  for (size_t i = 0; i + 1 < table.size(); ++i) EXPECT_EQ(s->pool().ref_count(table[i]), kN);
  const auto rest = run_to_idle(*s);
  EXPECT_EQ(count_events(rest, EventKind::Cow), 0) << "no copy after the partial block";
  std::set<std::vector<int32_t>> distinct;
  for (int k = 0; k < kN; ++k) {
    SamplerConfig sc = r.sampler;
    sc.seed = sample_seed(r.sampler.seed, k);
    const Solo want = run_solo(model_, prompt, kMax, model_->config().n_ctx, false, sc);
    EXPECT_EQ(s->state(k), SeqState::Finished);
    EXPECT_EQ(s->generated(k), want.gen) << "sample " << k;
    EXPECT_TRUE(same_bits(s->last_logits(k), want.logits)) << "sample " << k;
    distinct.insert(s->generated(k));
  }
  EXPECT_GT(distinct.size(), 1u) << "four samples at temperature 0.9 all alike";
  EXPECT_GT(s->stats().unshared_kv_bytes, s->stats().peak_kv_bytes);
}

// A prompt that fills its blocks exactly leaves nothing to copy: the samples write their
// first tokens into blocks of their own. A request of more samples than may run at once is
// refused; cancelling a request before its fork cancels its samples.
TEST_F(SchedulerTest, ForksOfAFullBlockPromptCopyNothingAndBadSampleCountsAreRefused) {
  auto be = make_cpu_backend(2);
  SchedulerConfig c = config();
  c.max_seqs = 4;
  auto s = make(c, *be);
  ASSERT_TRUE(s);
  std::vector<int32_t> prompt = tokens(kPrompts[6]);
  ASSERT_GT(prompt.size(), 32u);
  prompt.resize(32);
  Request r;
  r.prompt = prompt;
  r.max_tokens = 4;
  r.n = 3;
  ASSERT_TRUE(s->add(r).ok());
  const auto steps = run_to_idle(*s);
  EXPECT_EQ(count_events(steps, EventKind::Fork), 2);
  EXPECT_EQ(count_events(steps, EventKind::Cow), 0);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(s->generated(k), solo(prompt, 4).gen) << "greedy";
  Request bad = r;
  bad.n = 5;
  EXPECT_FALSE(s->add(bad).ok()) << "more samples than --max-seqs";
  bad.n = 0;
  EXPECT_FALSE(s->add(bad).ok());
  r.arrival_step = 1000;
  auto id = s->add(r);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(s->cancel(*id).ok());
  for (int k = 0; k < 3; ++k) EXPECT_EQ(s->state(*id + k), SeqState::Cancelled);
  EXPECT_TRUE(s->idle());
}

TEST_F(SchedulerTest, EverySequenceEqualsItsSoloRunBitForBit) {
  const int kMax = 10;
  auto be = make_cpu_backend(2);
  SchedulerConfig c = config();
  c.max_batch_tokens = 32;
  c.max_seqs = 6;
  auto s = make(c, *be);
  ASSERT_TRUE(s);
  const int arrivals[] = {1, 1, 2, 3, 5, 8, 13, 21};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(tokens(kPrompts[i]));
    Request r;
    r.prompt = prompts.back();
    r.max_tokens = kMax;
    r.arrival_step = arrivals[i];
    auto id = s->add(r);
    ASSERT_TRUE(id.ok()) << id.error().message;
    EXPECT_EQ(*id, i);
  }
  ASSERT_GT(int(prompts[6].size()), c.max_batch_tokens) << "a prompt must be chunked";
  const auto steps = run_to_idle(*s);
  EXPECT_GT(count_events(steps, EventKind::Chunk), 0);
  EXPECT_EQ(count_events(steps, EventKind::Preempt), 0);
  for (const BatchStep& st : steps)
    for (const SchedEvent& e : st.events)
      if (e.kind == EventKind::Arrive) {
        EXPECT_EQ(st.step, arrivals[e.seq]) << "request " << e.seq;
      }
  for (int i = 0; i < 8; ++i) {
    const Solo& want = solo(prompts[size_t(i)], kMax);
    EXPECT_EQ(s->state(i), SeqState::Finished) << "request " << i;
    EXPECT_EQ(s->stop_reason(i), StopReason::MaxTokens);
    EXPECT_EQ(s->generated(i), want.gen) << "request " << i << " (" << kPrompts[i] << ")";
    EXPECT_TRUE(same_bits(s->last_logits(i), want.logits))
        << "request " << i << ": the last logits differ from the solo run's";
  }
  EXPECT_EQ(s->stats().finished, 8);
  EXPECT_EQ(s->pool().counts().used, 0);
}

// Nine blocks of 8 positions for four sequences that grow to 6, 4, 3 and 3 blocks: the
// newest running sequence is preempted when an older one needs a block and recomputed
// later (with prefix caching, starting from the blocks it had published), and every
// sequence still ends with its solo tokens and logits.
TEST_F(SchedulerTest, PreemptedSequencesStillEqualTheirSoloRuns) {
  const int kMax = 14;
  std::vector<std::vector<int32_t>> prompts;
  for (int i : {2, 4, 1, 3}) prompts.push_back(tokens(kPrompts[i]));
  for (bool prefix : {false, true}) {
    SCOPED_TRACE(prefix ? "prefix caching" : "no prefix caching");
    auto be = make_cpu_backend(2);
    SchedulerConfig c = config();
    c.block_size = 8;
    c.pool_blocks = 9;
    c.max_batch_tokens = 64;
    c.prefix_caching = prefix;
    auto s = make(c, *be);
    ASSERT_TRUE(s);
    for (const auto& p : prompts) {
      Request r;
      r.prompt = p;
      r.max_tokens = kMax;
      ASSERT_LE(kv_blocks_for(int(p.size()) + kMax, 8), c.pool_blocks);
      ASSERT_TRUE(s->add(r).ok());
    }
    const auto steps = run_to_idle(*s);
    EXPECT_GT(count_events(steps, EventKind::Preempt), 0);
    EXPECT_EQ(s->stats().preemptions, count_events(steps, EventKind::Preempt));
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(s->state(int(i)), SeqState::Finished);
      const Solo& want = solo(prompts[i], kMax);
      EXPECT_EQ(s->generated(int(i)), want.gen) << "request " << i;
      EXPECT_TRUE(same_bits(s->last_logits(int(i)), want.logits)) << "request " << i;
    }
    const KvPoolCounts n = s->pool().counts();
    EXPECT_EQ(n.used, 0) << "blocks leaked";
    EXPECT_EQ(n.free + n.cached, n.total);
    if (prefix) {
      // Recomputes start from the blocks their sequence published before it was preempted.
      EXPECT_GT(s->stats().prefix_hit_tokens, 0u);
    } else {
      EXPECT_EQ(n.cached, 0);
      EXPECT_EQ(s->stats().prefix_hit_tokens, 0u);
    }
  }
}

// Two prompts sharing at least two 16-position blocks: the second, arriving while the
// first runs, adopts the shared blocks (a PrefixHit of their tokens) and prefills only the
// rest; a third, the first prompt again after both finished, finds its blocks in the LRU
// cache. Tokens and logits equal a cold run's (prefix caching off) bit for bit.
TEST_F(SchedulerTest, PrefixCacheSkipsTheSharedBlocksAndChangesNothing) {
  const int kMax = 8;
  const std::string shared = kPrompts[6];
  const auto a = tokens(shared + " is why");
  const auto b = tokens(shared + " discovery was surprising to");
  size_t common = 0;
  while (common < std::min(a.size(), b.size()) && a[common] == b[common]) ++common;
  const int B = 16;
  ASSERT_GE(int(common), 2 * B) << "the prompts must share two blocks";
  const int hit_b = std::min(int(common) / B, (int(b.size()) - 1) / B) * B;
  const int hit_a = (int(a.size()) - 1) / B * B;
  const int arrivals[] = {1, 3, 40};
  const std::vector<int32_t>* prompts[] = {&a, &b, &a};

  std::vector<std::unique_ptr<Scheduler>> runs;
  std::vector<std::vector<BatchStep>> traces;
  for (bool prefix : {true, false}) {
    auto be = make_cpu_backend(2);
    SchedulerConfig c = config();
    c.block_size = B;
    c.prefix_caching = prefix;
    auto s = make(c, *be);
    ASSERT_TRUE(s);
    for (int i = 0; i < 3; ++i) {
      Request r;
      r.prompt = *prompts[i];
      r.max_tokens = kMax;
      r.arrival_step = arrivals[i];
      ASSERT_TRUE(s->add(r).ok());
    }
    traces.push_back(run_to_idle(*s));
    runs.push_back(std::move(s));
  }
  const Scheduler& warm = *runs[0];
  const Scheduler& cold = *runs[1];
  const auto& steps = traces[0];
  // Request 1 arrived while request 0 was still running.
  for (const BatchStep& st : steps)
    if (st.step == arrivals[1]) {
      EXPECT_EQ(st.running, 2);
    }
  int hits[3] = {-1, -1, -1};
  for (const BatchStep& st : steps)
    for (const SchedEvent& e : st.events)
      if (e.kind == EventKind::PrefixHit) hits[e.seq] = e.n;
  EXPECT_EQ(hits[0], -1);
  EXPECT_EQ(hits[1], hit_b);
  EXPECT_EQ(hits[2], hit_a);
  EXPECT_EQ(warm.stats().prefix_hit_tokens, uint64_t(hit_a + hit_b));
  const uint64_t prompt_tokens = 2 * a.size() + b.size();
  EXPECT_EQ(warm.stats().prefill_tokens, prompt_tokens - uint64_t(hit_a + hit_b));
  EXPECT_EQ(cold.stats().prefill_tokens, prompt_tokens);
  EXPECT_EQ(cold.stats().prefix_hit_tokens, 0u);
  EXPECT_EQ(count_events(traces[1], EventKind::PrefixHit), 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(warm.generated(i), cold.generated(i)) << "request " << i;
    EXPECT_TRUE(same_bits(warm.last_logits(i), cold.last_logits(i))) << "request " << i;
    EXPECT_EQ(warm.generated(i), solo(*prompts[i], kMax).gen) << "request " << i;
  }
  EXPECT_EQ(warm.pool().counts().used, 0);
  EXPECT_GT(warm.pool().counts().cached, 0);
}

// --- A tiny model: fast enough for thousands of random steps.

// The blocks a request may hold at once in a scheduler over `model`: every block of its
// positions in a group of global layers; in a windowed group, what one step's queries see
// (the window and a step's tokens) and the sinks.
int blocks_held_at_most(const Model& model, KvTypes types, int positions, int block, int budget) {
  const KvLayerGroups g = kv_layer_groups(kv_cache_config(model, types, KvPolicy::Full));
  int need = 0;
  for (int i = 0; i < g.count(); ++i) {
    const int W = g.window[size_t(i)], all = kv_blocks_for(positions, block);
    need += W == 0 ? all
                   : std::min(all, kv_blocks_for(W - 1 + budget, block) + 1 +
                                       kv_blocks_for(g.sink[size_t(i)], block));
  }
  return need;
}

class TinySchedulerTest : public ::testing::Test {
 protected:
  // Two tiny models with their BOS id moved from <|im_start|> (1) to <|endoftext|> (0):
  // like SmolLM2's <file_sep> or <jupyter_code>, <|im_start|> is then a control token that
  // is neither BOS nor end-of-generation, which ends a Session's run under stop_at_eos.
  // The llama has one group of layers; the gemma3 (local, local, global layers, window 13)
  // three, whose local ones give their blocks back outside the window.
  static void SetUpTestSuite() {
    test::TinyModelSpec spec;
    spec.seed = 11;
    spec.n_ctx = 192;
    model_ = load(test::tiny_llama(spec).build());
    test::TinyModelSpec gs = test::tiny_family("gemma3", 23);
    gs.n_ctx = 192;
    gs.window = 13;
    gemma_ = load(test::tiny_model(gs).build());
  }
  static std::shared_ptr<Model> load(std::vector<uint8_t> bytes) {
    const std::string key = "tokenizer.ggml.bos_token_id";
    auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
    EXPECT_NE(at, bytes.end());
    if (at == bytes.end()) return nullptr;
    const size_t value = size_t(at - bytes.begin()) + key.size() + 4;  // after the u32 type
    EXPECT_EQ(bytes[value], 1);
    bytes[value] = 0;
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("kvscope_sched_" + std::to_string(getpid()) + ".gguf"))
                                 .string();
    {
      std::ofstream f(path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
      EXPECT_TRUE(bool(f));
    }
    auto m = Model::load(path);
    std::filesystem::remove(path);
    EXPECT_TRUE(m.ok()) << m.error().message;
    if (!m.ok()) return nullptr;
    const Tokenizer& tok = (*m)->tokenizer();
    EXPECT_EQ(tok.bos_id(), 0);
    EXPECT_TRUE(tok.is_control(kControl) && !tok.is_eog(kControl));
    return std::move(*m);
  }
  static void TearDownTestSuite() {
    model_.reset();
    gemma_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(model_);
    ASSERT_TRUE(gemma_);
  }
  static constexpr int32_t kControl = 1;  // <|im_start|>
  static inline std::shared_ptr<Model> model_, gemma_;
};

// Random rounds: each on one of the two tiny models, with a random configuration (block
// size, pool size down to the least one request needs, token budget down to 1, sequence
// limit down to 1, prefix caching, EOS, context, K/V types, attention rows) and random
// requests (random ids, often sharing a prefix with an earlier prompt or repeating it,
// greedy or seeded sampling, random arrivals), with random cancels of pending, waiting and
// running requests between steps.
TEST_F(TinySchedulerTest, RandomWorkloadsKeepThePoolSoundAndMatchSoloRuns) {
  const int V = model_->config().n_vocab;
  // KVSCOPE_SCHED_ROUNDS and KVSCOPE_SCHED_SEED run it longer or differently by hand.
  const char* env_rounds = std::getenv("KVSCOPE_SCHED_ROUNDS");
  const char* env_seed = std::getenv("KVSCOPE_SCHED_SEED");
  const int rounds = env_rounds ? std::atoi(env_rounds) : test::kAddressSanitizer ? 50 : 100;
  std::mt19937 rng(env_seed ? uint32_t(std::strtoul(env_seed, nullptr, 10)) : 20261125u);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  // Solo runs, once per (prompt, max tokens, context, EOS, sampler).
  std::map<std::tuple<bool, std::vector<int32_t>, int, int, bool, float, int, uint64_t, int, int>,
           Solo>
      memo;
  auto backend = make_cpu_backend(2);
  int total_steps = 0, preemptions = 0, hits = 0, cancels = 0, finished = 0, chunks = 0;
  int windowed_rounds = 0, given_back = 0;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const bool windowed = chance(0.4);
    windowed_rounds += windowed;
    const std::shared_ptr<Model>& model = windowed ? gemma_ : model_;
    SchedulerConfig c;
    c.block_size = std::array{8, 16, 32}[size_t(uniform(0, 2))];
    c.context = chance(0.5) ? 0 : uniform(24, 192);
    c.max_batch_tokens = chance(0.2) ? uniform(1, 4) : uniform(5, 96);
    c.max_seqs = uniform(1, 8);
    c.prefix_caching = chance(0.7);
    c.stop_at_eos = chance(0.5);
    c.attention = chance(0.3);
    if (chance(0.3))
      c.kv_types =
          chance(0.5) ? KvTypes{KvDtype::F32, KvDtype::F32} : KvTypes{KvDtype::F16, KvDtype::F32};
    const int ctx = c.context > 0 ? c.context : model->config().n_ctx;
    // Requests first: the pool is sized against the largest.
    const int n_req = uniform(2, 10);
    std::vector<Request> reqs;
    int most_blocks = 1;
    for (int i = 0; i < n_req; ++i) {
      Request r;
      const int len = chance(0.15) ? uniform(1, 3) : uniform(1, std::min(ctx - 1, 90));
      if (!reqs.empty() && chance(0.4)) {
        // An earlier prompt's start (whole blocks of it, often), then new tokens.
        const auto& base = reqs[size_t(uniform(0, int(reqs.size()) - 1))].prompt;
        int keep = uniform(1, int(base.size()));
        if (chance(0.5)) keep = std::max(1, keep / c.block_size * c.block_size);
        r.prompt.assign(base.begin(), base.begin() + std::min(keep, len));
      }
      while (int(r.prompt.size()) < len) r.prompt.push_back(uniform(0, V - 1));
      r.max_tokens = chance(0.1) ? 1 : uniform(1, 24);
      if (chance(0.25)) {
        r.sampler.temperature = 0.8f;
        r.sampler.top_k = chance(0.5) ? 0 : 20;
        r.sampler.seed = uint64_t(uniform(0, 1000));
      }
      r.arrival_step = chance(0.3) ? 1 : uniform(1, 40);
      const int most = std::min(int(r.prompt.size()) + r.max_tokens, ctx);
      most_blocks = std::max(most_blocks, blocks_held_at_most(*model, c.kv_types, most,
                                                              c.block_size, c.max_batch_tokens));
      reqs.push_back(std::move(r));
    }
    c.pool_blocks = most_blocks + (chance(0.5) ? uniform(0, 2) : uniform(0, 30));
    SCOPED_TRACE(std::string(windowed ? "gemma3, " : "llama, ") + "block " +
                 std::to_string(c.block_size) + ", pool " + std::to_string(c.pool_blocks) +
                 ", budget " + std::to_string(c.max_batch_tokens) + ", seqs " +
                 std::to_string(c.max_seqs) + ", context " + std::to_string(ctx) + ", kv " +
                 kv_types_name(c.kv_types) + (c.prefix_caching ? ", prefix" : "") +
                 (c.stop_at_eos ? ", eos" : "") + (c.attention ? ", attention" : ""));
    auto made = Scheduler::create(model, *backend, c);
    ASSERT_TRUE(made.ok()) << made.error().message;
    Scheduler& s = **made;
    for (const Request& r : reqs) {
      auto id = s.add(r);
      ASSERT_TRUE(id.ok()) << id.error().message;
    }
    const double cancel_rate = chance(0.5) ? 0.0 : 0.04;
    std::vector<bool> cancelled(reqs.size(), false);
    int steps = 0;
    while (!s.idle()) {
      if (chance(cancel_rate)) {
        const int id = uniform(0, n_req - 1);
        const SeqState before = s.state(id);
        const bool live = before == SeqState::Pending || before == SeqState::Waiting ||
                          before == SeqState::Running;
        Status st = s.cancel(id);
        EXPECT_EQ(st.ok(), live) << "cancel of a " << seq_state_name(before) << " request";
        if (live) {
          cancelled[size_t(id)] = true;
          ++cancels;
          EXPECT_EQ(s.state(id), SeqState::Cancelled);
          Status chk = s.check();
          ASSERT_TRUE(chk.ok()) << "after a cancel: " << chk.message();
        }
      }
      auto st = s.step();
      ASSERT_TRUE(st.ok()) << st.error().message;
      Status chk = s.check();
      ASSERT_TRUE(chk.ok()) << "after step " << st->step << ": " << chk.message();
      ASSERT_LE(st->batch_tokens, c.max_batch_tokens);
      ASSERT_LE(st->running, c.max_seqs);
      int row_tokens = 0;
      for (const StepRow& row : st->rows) {
        row_tokens += row.tokens;
        EXPECT_GE(int(row.table.size()) * c.block_size, row.pos0 + row.tokens) << "seq " << row.seq;
        for (const auto& t : row.tables) given_back += int(std::count(t.begin(), t.end(), -1));
        EXPECT_LE(row.pos0 + row.tokens, ctx);
        const ModelConfig& mc = model->config();
        if (c.attention && row.token_id >= 0) {
          EXPECT_EQ(row.attention.size(), size_t(mc.n_layer) * mc.n_head * (row.pos0 + row.tokens));
        } else {
          EXPECT_TRUE(row.attention.empty());
        }
      }
      EXPECT_EQ(row_tokens, st->batch_tokens);
      EXPECT_EQ(st->pool.counts.used + st->pool.counts.free + st->pool.counts.cached,
                c.pool_blocks);
      for (const SchedEvent& e : st->events) {
        preemptions += e.kind == EventKind::Preempt;
        hits += e.kind == EventKind::PrefixHit;
        chunks += e.kind == EventKind::Chunk;
      }
      ASSERT_LT(++steps, 20000) << "no progress";
    }
    total_steps += steps;
    const KvPoolCounts n = s.pool().counts();
    EXPECT_EQ(n.used, 0) << "blocks leaked";
    EXPECT_EQ(n.free + n.cached, n.total);
    for (int i = 0; i < n_req; ++i) {
      const Request& r = reqs[size_t(i)];
      const auto key = std::make_tuple(windowed, r.prompt, r.max_tokens, ctx, c.stop_at_eos,
                                       r.sampler.temperature, r.sampler.top_k, r.sampler.seed,
                                       int(c.kv_types.k), int(c.kv_types.v));
      auto it = memo.find(key);
      if (it == memo.end())
        it = memo.emplace(key, run_solo(model, r.prompt, r.max_tokens, ctx, c.stop_at_eos,
                                        r.sampler, c.kv_types))
                 .first;
      const Solo& want = it->second;
      if (cancelled[size_t(i)]) {
        EXPECT_EQ(s.state(i), SeqState::Cancelled);
        // What it generated before the cancel is the start of its solo run.
        const auto& g = s.generated(i);
        ASSERT_LE(g.size(), want.gen.size()) << "request " << i;
        EXPECT_TRUE(std::equal(g.begin(), g.end(), want.gen.begin())) << "request " << i;
        continue;
      }
      ++finished;
      EXPECT_EQ(s.state(i), SeqState::Finished) << "request " << i;
      EXPECT_EQ(s.generated(i), want.gen)
          << "request " << i << ": prompt [" << ids_text(r.prompt) << "], max tokens "
          << r.max_tokens << ", temperature " << r.sampler.temperature;
      EXPECT_EQ(s.stop_reason(i), want.stop) << "request " << i;
      EXPECT_TRUE(same_bits(s.last_logits(i), want.logits)) << "request " << i;
    }
  }
  std::printf(
      "%d rounds (%d windowed), %d steps: %d finished, %d cancelled, %d preemptions, "
      "%d prefix hits, %d chunks, %d blocks given back outside a window\n",
      rounds, windowed_rounds, total_steps, finished, cancels, preemptions, hits, chunks,
      given_back);
  // The workload must reach what it is meant to test.
  if (env_rounds) return;
  EXPECT_GT(total_steps, test::kAddressSanitizer ? 2500 : 5000);
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(hits, 0);
  EXPECT_GT(cancels, 0);
  EXPECT_GT(chunks, 0);
  EXPECT_GT(given_back, 0);
}

// Requests the scheduler must refuse, each with a message naming the problem; the
// scheduler is unchanged by them and serves a valid request afterwards.
TEST_F(TinySchedulerTest, BadRequestsAreRefusedAndTheSchedulerStaysUsable) {
  const int V = model_->config().n_vocab;
  auto backend = make_cpu_backend(2);
  SchedulerConfig c;
  c.block_size = 8;
  c.pool_blocks = 4;  // 32 positions
  c.context = 64;
  c.stop_at_eos = false;
  auto made = Scheduler::create(model_, *backend, c);
  ASSERT_TRUE(made.ok()) << made.error().message;
  Scheduler& s = **made;
  auto refused = [&](std::vector<int32_t> prompt, int max_tokens, const std::string& says) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    auto id = s.add(r);
    ASSERT_FALSE(id.ok()) << "accepted a request that should say: " << says;
    EXPECT_NE(id.error().message.find(says), std::string::npos) << id.error().message;
    EXPECT_EQ(s.size(), 0);
    EXPECT_TRUE(s.idle());
    EXPECT_TRUE(s.check().ok());
  };
  refused({}, 4, "no tokens");
  refused({5, V, 7}, 4, "token 1 has id " + std::to_string(V) + ", outside the vocabulary");
  refused({5, -1}, 4, "token 1 has id -1, outside the vocabulary");
  refused(std::vector<int32_t>(64, 9), 1,
          "the prompt has 64 tokens but a sequence holds at most 64");
  refused(std::vector<int32_t>(200, 9), 1, "the prompt has 200 tokens");
  refused(std::vector<int32_t>(20, 9), 13,
          "33 positions need 5 blocks of 8 positions but the pool has 4");
  refused({5, 6}, 0, "max tokens 0");
  EXPECT_EQ(s.pool().counts().used, 0);
  EXPECT_FALSE(s.cancel(0).ok());
  EXPECT_FALSE(s.cancel(-1).ok());

  // The scheduler still serves requests: one that just fits the pool, one just under the
  // context, both equal to their solo runs.
  Request fits;
  fits.prompt = {3, 40, 41, 72, 100, 101, 102, 33, 3, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27};
  fits.max_tokens = 12;  // 32 positions: all four blocks
  auto id = s.add(fits);
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(*id, 0);
  run_to_idle(s);
  EXPECT_EQ(s.state(0), SeqState::Finished);
  EXPECT_EQ(s.generated(0), run_solo(model_, fits.prompt, 12, 64, false).gen);
  auto again = s.cancel(0);
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("already finished"), std::string::npos) << again.message();
  EXPECT_EQ(s.pool().counts().used, 0);

  // Configurations the scheduler refuses.
  auto bad_config = [&](SchedulerConfig bc, const std::string& says) {
    auto r = Scheduler::create(model_, *backend, bc);
    ASSERT_FALSE(r.ok()) << "accepted a configuration that should say: " << says;
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  };
  SchedulerConfig b = c;
  b.block_size = 12;
  bad_config(b, "block size 12");
  b = c;
  b.max_batch_tokens = 0;
  bad_config(b, "max batch tokens 0");
  b = c;
  b.max_seqs = 0;
  bad_config(b, "max seqs 0");
  EXPECT_FALSE(Scheduler::create(nullptr, *backend, c).ok());
}

// The context ends a sequence like a solo run's (ContextFull), even when the pool holds
// less than a whole context for it.
TEST_F(TinySchedulerTest, AFullContextStopsASequenceLikeItsSoloRun) {
  auto backend = make_cpu_backend(2);
  SchedulerConfig c;
  c.block_size = 8;
  c.context = 30;
  c.pool_blocks = 4;
  c.max_batch_tokens = 7;
  c.stop_at_eos = false;
  auto made = Scheduler::create(model_, *backend, c);
  ASSERT_TRUE(made.ok()) << made.error().message;
  Scheduler& s = **made;
  Request r;
  r.prompt = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
  r.max_tokens = 100;
  ASSERT_TRUE(s.add(r).ok());
  run_to_idle(s);
  const Solo want = run_solo(model_, r.prompt, 100, 30, false);
  EXPECT_EQ(want.stop, StopReason::ContextFull);
  EXPECT_EQ(s.stop_reason(0), StopReason::ContextFull);
  EXPECT_EQ(s.generated(0), want.gen);
  EXPECT_EQ(int(r.prompt.size() + s.generated(0).size()), 30);
  EXPECT_EQ(s.pool().counts().used, 0);
}

// Under stop_at_eos a sequence ends where its solo run ends: at an end-of-generation token
// and also at any other control token but BOS (Session's rule), here <|im_start|>.
TEST_F(TinySchedulerTest, AControlTokenEndsASequenceLikeItsSoloRun) {
  const int V = model_->config().n_vocab;
  std::mt19937 rng(7);
  // A prompt whose greedy run emits the control token (stop_at_eos off).
  std::vector<int32_t> prompt;
  Solo open;
  for (int tries = 0; tries < 2000; ++tries) {
    std::vector<int32_t> p(size_t(std::uniform_int_distribution<int>(1, 20)(rng)));
    for (int32_t& t : p) t = std::uniform_int_distribution<int>(3, V - 1)(rng);
    Solo r = run_solo(model_, p, 24, 192, false);
    const auto at = std::find(r.gen.begin(), r.gen.end(), kControl);
    if (at != r.gen.end() && at + 1 != r.gen.end() &&
        std::none_of(r.gen.begin(), at, [&](int32_t t) { return model_->tokenizer().is_eog(t); })) {
      prompt = p;
      open = r;
      break;
    }
  }
  ASSERT_FALSE(prompt.empty()) << "no prompt emits the control token";
  const Solo want = run_solo(model_, prompt, 24, 192, true);
  ASSERT_EQ(want.stop, StopReason::Eos);
  ASSERT_EQ(want.gen.back(), kControl);
  ASSERT_LT(want.gen.size(), open.gen.size());
  auto backend = make_cpu_backend(2);
  SchedulerConfig c;
  c.block_size = 8;
  c.stop_at_eos = true;
  auto made = Scheduler::create(model_, *backend, c);
  ASSERT_TRUE(made.ok()) << made.error().message;
  Scheduler& s = **made;
  Request r;
  r.prompt = prompt;
  r.max_tokens = 24;
  ASSERT_TRUE(s.add(r).ok());
  run_to_idle(s);
  EXPECT_EQ(s.generated(0), want.gen) << "prompt [" << ids_text(prompt) << "]";
  EXPECT_EQ(s.stop_reason(0), StopReason::Eos);
}

// What a server does when a client goes away: cancelling a running sequence mid-decode
// gives every block it holds back to the pool (the invariants hold, nothing used), and
// the others run on; cancelling one sample of a request before the fork leaves the
// request's other samples to fork and finish; forget() frees an ended sequence's text.
TEST_F(TinySchedulerTest, ACancelledSequenceGivesItsBlocksBackAndOthersRunOn) {
  auto backend = make_cpu_backend(2);
  SchedulerConfig c;
  c.block_size = 8;
  c.stop_at_eos = false;
  auto made = Scheduler::create(model_, *backend, c);
  ASSERT_TRUE(made.ok()) << made.error().message;
  Scheduler& s = **made;
  Request r;
  r.prompt = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110};
  r.max_tokens = 40;
  ASSERT_TRUE(s.add(r).ok());  // 0
  Request other = r;
  other.prompt = {7, 8, 9};
  other.max_tokens = 6;
  ASSERT_TRUE(s.add(other).ok());  // 1
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.step().ok());
  ASSERT_EQ(s.state(0), SeqState::Running);
  const int before = s.pool().counts().used;
  ASSERT_GE(before, 2 + 1);  // 16 positions of sequence 0, 8 of sequence 1
  ASSERT_TRUE(s.cancel(0).ok());
  EXPECT_EQ(s.state(0), SeqState::Cancelled);
  EXPECT_LT(s.pool().counts().used, before);
  EXPECT_TRUE(s.check().ok()) << s.check().message();
  EXPECT_FALSE(s.cancel(0).ok()) << "a second cancel of the same sequence";
  run_to_idle(s);
  EXPECT_EQ(s.state(1), SeqState::Finished);
  EXPECT_EQ(s.generated(1), run_solo(model_, other.prompt, 6, 192, false).gen);
  EXPECT_EQ(s.pool().counts().used, 0);
  EXPECT_TRUE(s.check().ok());

  // Three samples; the second is cancelled before its request's prompt is computed.
  Request three = r;
  three.max_tokens = 4;
  three.n = 3;
  auto first = s.add(three);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(s.cancel(*first + 1).ok());
  run_to_idle(s);
  EXPECT_EQ(s.state(*first), SeqState::Finished);
  EXPECT_EQ(s.state(*first + 1), SeqState::Cancelled);
  EXPECT_EQ(s.state(*first + 2), SeqState::Finished);
  EXPECT_EQ(s.generated(*first + 2).size(), 4u);
  EXPECT_EQ(s.pool().counts().used, 0);
  EXPECT_TRUE(s.check().ok());

  ASSERT_TRUE(s.forget(*first).ok());
  EXPECT_TRUE(s.generated(*first).empty());
  EXPECT_TRUE(s.text(*first).empty());
  EXPECT_EQ(s.state(*first), SeqState::Finished);
  EXPECT_EQ(s.stop_reason(*first), StopReason::MaxTokens);
  EXPECT_TRUE(s.forget(*first).ok()) << "a second forget";
  EXPECT_FALSE(s.cancel(*first).ok()) << "cancel of a forgotten sequence";
  for (int id = 0; id < s.size(); ++id) ASSERT_TRUE(s.forget(id).ok()) << id;
  EXPECT_TRUE(s.check().ok());
  // The scheduler runs on past forgotten sequences.
  ASSERT_TRUE(s.add(other).ok());
  run_to_idle(s);
  EXPECT_EQ(s.generated(s.size() - 1), run_solo(model_, other.prompt, 6, 192, false).gen);
  Request late = other;
  late.arrival_step = 1 << 20;
  auto pending = s.add(late);
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(s.forget(*pending).ok()) << "forget of a live sequence";
  ASSERT_TRUE(s.cancel(*pending).ok());
  EXPECT_TRUE(s.idle());
}

// Log-probabilities on request: the sampled token's, greedy, is the largest, and the top
// ones come sorted and sum (as probabilities) to at most 1.
TEST_F(TinySchedulerTest, LogprobsOfTheSampledTokenAndTheTopOnes) {
  auto backend = make_cpu_backend(2);
  SchedulerConfig c;
  c.block_size = 8;
  c.stop_at_eos = false;
  auto made = Scheduler::create(model_, *backend, c);
  ASSERT_TRUE(made.ok()) << made.error().message;
  Scheduler& s = **made;
  Request r;
  r.prompt = {10, 20, 30};
  r.max_tokens = 3;
  r.logprobs = 4;
  ASSERT_TRUE(s.add(r).ok());
  Request bad = r;
  bad.logprobs = 21;
  EXPECT_FALSE(s.add(bad).ok());
  int rows = 0;
  while (!s.idle()) {
    auto st = s.step();
    ASSERT_TRUE(st.ok());
    for (const StepRow& row : st->rows) {
      if (row.token_id < 0) continue;
      ++rows;
      ASSERT_EQ(row.top_logprobs.size(), 4u);
      EXPECT_EQ(row.top_logprobs[0].first, row.token_id);
      EXPECT_FLOAT_EQ(row.top_logprobs[0].second, row.logprob);
      EXPECT_LE(row.logprob, 0.0f);
      double p = 0;
      for (size_t i = 0; i < 4; ++i) {
        p += std::exp(double(row.top_logprobs[i].second));
        if (i > 0) {
          EXPECT_LE(row.top_logprobs[i].second, row.top_logprobs[i - 1].second);
        }
      }
      EXPECT_LE(p, 1.0 + 1e-5);
    }
  }
  EXPECT_EQ(rows, 3);
}

}  // namespace
}  // namespace kvscope
