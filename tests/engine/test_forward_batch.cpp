// test_forward_batch.cpp — forward_batch on the default model (CPU, 2 threads) over paged
// caches sharing one block pool: eight prompts of 3 to 60 tokens joining one step apart
// (each prefill in the same pass as the others' one-token decode steps, the batch order
// rotating every step) give, for f16 and q8_0 K/V, the tokens, logits, attention rows,
// K/V row norms and FLOPs of the same prompt run alone through forward() on an ordinary
// contiguous cache, bit for bit; a sequence that adopts another's published prompt blocks
// computes only the rest of its prompt and still matches a cold run bit for bit; two
// sequences writing one shared block in the same pass each get their own copy; a batch
// naming one cache twice, or one the pool cannot hold, is refused and leaves every cache
// as it was.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "tests/util/model_fixture.h"

namespace kvscope {
namespace {

constexpr KvTypes kF16{KvDtype::F16, KvDtype::F16};
constexpr KvTypes kQ8{KvDtype::Q8_0, KvDtype::Q8_0};
constexpr uint64_t kSalt = 1;

const char* const kTexts[] = {
    "The old lighthouse keeper climbed the stairs and looked out over the grey sea, where "
    "the fishing boats were coming home before the storm. He lit the lamp, wound the clock "
    "and wrote the time in the logbook, as his father had done for forty years before him.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nprint([fibonacci(i) for i in range(10)])\n",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon "
    "dioxide to make glucose and oxygen. It happens mostly in the leaves, inside small "
    "organelles called chloroplasts, which contain the green pigment chlorophyll.",
    "Once upon a time, in a village at the edge of a great forest, there lived a girl who "
    "could talk to foxes. Every morning she walked to the river with a basket of bread, "
    "and every morning the oldest fox was waiting for her under the willow tree, asking "
    "for news of the hunters and of the weather in the hills beyond the river.",
    "Paris, Berlin, Madrid, Rome, Vienna, Prague, Warsaw, Lisbon, Dublin, Athens, Oslo, "
    "Stockholm, Helsinki, Copenhagen, Brussels, Amsterdam, Bern, Budapest.",
    "Q: What is the boiling point of water at sea level?\nA: 100 degrees Celsius.\nQ: And "
    "the freezing point?\nA: 0 degrees Celsius.\nQ: What is the chemical formula of "
    "water?\nA:",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181",
    "Dear hiring committee, I am writing to apply for the position of assistant librarian "
    "that was advertised last week in the local newspaper. I have worked with books for "
    "most of my life, first in my grandmother's shop and then at the university library, "
    "where I catalogued the collection of maps.",
};
constexpr int kLengths[] = {3, 52, 11, 60, 6, 25, 47, 17};
constexpr int kSeqs = 8, kGen = 12;

// Bit-for-bit equality of two float vectors, naming the first difference.
::testing::AssertionResult same_bits(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << ", expected " << want.size();
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0)
    return ::testing::AssertionSuccess();
  size_t i = 0;
  while (std::memcmp(&got[i], &want[i], sizeof(float)) == 0) ++i;
  return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << " is "
                                       << got[i] << ", expected " << want[i];
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

// One sequence run alone: forward() of the prompt, then greedy one-token steps.
struct Solo {
  std::vector<int32_t> tokens;  // the greedy tokens, one per step
  std::vector<std::vector<float>> logits, attention, k_norm, v_norm;  // per step
  std::vector<uint64_t> flops;
};

class ForwardBatchTest : public ModelTest<DefaultModelFile> {
 protected:
  void SetUp() override {
    ModelTest<DefaultModelFile>::SetUp();
    if (!IsSkipped()) be_ = make_cpu_backend(2);
  }

  // The first n tokens of `text` (after BOS where the model adds one and `bos`).
  static std::vector<int32_t> prompt(const char* text, int n, bool bos = true) {
    const Tokenizer& tok = model_->tokenizer();
    std::vector<int32_t> ids;
    if (bos && tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
    auto enc = tok.encode(text, false);
    EXPECT_TRUE(enc.ok());
    if (enc.ok()) ids.insert(ids.end(), enc->begin(), enc->end());
    EXPECT_GE(int(ids.size()), n) << text;
    ids.resize(std::min(ids.size(), size_t(n)));
    return ids;
  }
  static KvCacheConfig cache_config(KvTypes types) {
    return kv_cache_config(*model_, types, KvPolicy::Full);
  }
  static KvShape shape() {
    const ModelConfig& c = model_->config();
    return {c.n_layer, c.n_head_kv, c.head_dim};
  }
  std::shared_ptr<KvPool> make_pool(KvTypes types, int n_blocks, int block_size = 16) {
    auto p = be_->create_kv_pool(KvPoolConfig{shape(), types, block_size, n_blocks});
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? p.value() : nullptr;
  }
  std::unique_ptr<KvCache> make_paged(const std::shared_ptr<KvPool>& pool, KvTypes types) {
    auto c = be_->create_paged_kv_cache(cache_config(types), pool);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return c.ok() ? std::move(c.value()) : nullptr;
  }

  // `ids` alone through forward() on a contiguous cache, then steps - 1 greedy steps.
  Solo solo(const std::vector<int32_t>& ids, KvTypes types, int steps) {
    Solo s;
    auto cache = be_->create_kv_cache(cache_config(types), 64);
    EXPECT_TRUE(cache.ok());
    if (!cache.ok()) return s;
    std::vector<int32_t> feed = ids;
    int pos = 0;
    for (int k = 0; k < steps; ++k) {
      ForwardOutput out;
      Status st = forward(*be_, *model_, feed.data(), int(feed.size()), pos, **cache, out);
      EXPECT_TRUE(st.ok()) << st.message();
      if (!st.ok()) return s;
      pos += int(feed.size());
      s.tokens.push_back(argmax(out.logits));
      s.logits.push_back(std::move(out.logits));
      s.attention.push_back(std::move(out.attention));
      s.k_norm.push_back(std::move(out.k_norm));
      s.v_norm.push_back(std::move(out.v_norm));
      s.flops.push_back(out.flops);
      feed = {s.tokens.back()};
    }
    return s;
  }

  // Eight sequences, sequence i joining at step i, kGen greedy steps each, all through
  // forward_batch over paged caches of one pool; every step of every sequence equals its
  // solo run bit for bit. Sequences with an even index ask for attention rows.
  void run_staggered(KvTypes types);

  std::unique_ptr<Backend> be_;
};

void ForwardBatchTest::run_staggered(KvTypes types) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Solo> ref;
  for (int i = 0; i < kSeqs; ++i) {
    prompts.push_back(prompt(kTexts[i], kLengths[i]));
    ref.push_back(solo(prompts.back(), types, kGen));
    ASSERT_EQ(int(ref.back().tokens.size()), kGen);
  }
  auto pool = make_pool(types, 48);
  ASSERT_TRUE(pool);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<const std::vector<int32_t>*> tables;
  for (int i = 0; i < kSeqs; ++i) {
    caches.push_back(make_paged(pool, types));
    ASSERT_TRUE(caches.back());
    tables.push_back(&caches.back()->blocks());
  }
  std::vector<std::vector<int32_t>> got(kSeqs);  // greedy tokens per sequence

  int mixed_steps = 0;
  for (int step = 0; step < kSeqs - 1 + kGen; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<int> who;  // the sequences in this step, the batch order rotated by it
    for (int j = 0; j < kSeqs; ++j) {
      const int i = (j + step) % kSeqs;
      if (i <= step && step - i < kGen) who.push_back(i);
    }
    std::vector<BatchSeq> batch;
    int prefills = 0, decodes = 0;
    for (int i : who) {
      BatchSeq s;
      s.cache = caches[size_t(i)].get();
      if (step == i) {
        s.tokens = prompts[size_t(i)].data();
        s.T = int(prompts[size_t(i)].size());
        ++prefills;
      } else {
        s.tokens = &got[size_t(i)].back();
        s.T = 1;
        ++decodes;
      }
      s.attention = i % 2 == 0;
      s.norms = true;
      batch.push_back(s);
    }
    mixed_steps += prefills > 0 && decodes > 0;
    std::vector<BatchSeqOutput> out;
    Status st = forward_batch(*be_, *model_, batch, out);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(out.size(), batch.size());
    for (size_t b = 0; b < who.size(); ++b) {
      const int i = who[b], k = step - i;  // k: the sequence's own step
      SCOPED_TRACE("sequence " + std::to_string(i) + ", its step " + std::to_string(k));
      const Solo& r = ref[size_t(i)];
      EXPECT_TRUE(same_bits(out[b].logits, r.logits[size_t(k)]));
      if (i % 2 == 0) {
        EXPECT_TRUE(same_bits(out[b].attention, r.attention[size_t(k)]));
      } else {
        EXPECT_TRUE(out[b].attention.empty());
      }
      EXPECT_TRUE(same_bits(out[b].k_norm, r.k_norm[size_t(k)]));
      EXPECT_TRUE(same_bits(out[b].v_norm, r.v_norm[size_t(k)]));
      EXPECT_EQ(out[b].flops, r.flops[size_t(k)]);
      got[size_t(i)].push_back(argmax(out[b].logits));
      const int len = int(prompts[size_t(i)].size()) + k;
      EXPECT_EQ(caches[size_t(i)]->length(), len);
      EXPECT_EQ(int(caches[size_t(i)]->blocks().size()), kv_blocks_for(len, 16));
    }
    Status ok = pool->check(tables);
    ASSERT_TRUE(ok.ok()) << ok.message();
  }
  EXPECT_EQ(mixed_steps, kSeqs - 1) << "each later prefill went in with decode steps";
  for (int i = 0; i < kSeqs; ++i) EXPECT_EQ(got[size_t(i)], ref[size_t(i)].tokens) << i;
  // No block is shared here; all of them come back when the caches go.
  int blocks = 0;
  for (const auto& cache : caches) blocks += int(cache->blocks().size());
  EXPECT_EQ(pool->counts().used, blocks);
  caches.clear();
  EXPECT_EQ(pool->counts().free, pool->n_blocks());
}

TEST_F(ForwardBatchTest, StaggeredSequencesEqualTheirSoloRunsBitForBitF16) {
  run_staggered(kF16);
}

TEST_F(ForwardBatchTest, StaggeredSequencesEqualTheirSoloRunsBitForBitQ8_0) {
  run_staggered(kQ8);
}

// Every sequence asks for attention rows (one not for logits, so the LM head's shared
// product skips it); the tokens fed are the solo runs' greedy ones.
TEST_F(ForwardBatchTest, AttentionRowsEqualTheSoloForwardsBitForBit) {
  const int n = 4, steps = 3;
  const int lengths[n] = {9, 33, 47, 20};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Solo> ref;
  auto pool = make_pool(kF16, 16);
  ASSERT_TRUE(pool);
  std::vector<std::unique_ptr<KvCache>> caches;
  for (int i = 0; i < n; ++i) {
    prompts.push_back(prompt(kTexts[i + 4], lengths[i]));
    ref.push_back(solo(prompts.back(), kF16, steps));
    caches.push_back(make_paged(pool, kF16));
    ASSERT_TRUE(caches.back());
  }
  for (int k = 0; k < steps; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    std::vector<BatchSeq> batch;
    for (int i = 0; i < n; ++i) {
      BatchSeq s;
      s.cache = caches[size_t(i)].get();
      s.tokens = k == 0 ? prompts[size_t(i)].data() : &ref[size_t(i)].tokens[size_t(k - 1)];
      s.T = k == 0 ? int(prompts[size_t(i)].size()) : 1;
      s.logits = i != 1;
      s.attention = true;
      batch.push_back(s);
    }
    std::vector<BatchSeqOutput> out;
    Status st = forward_batch(*be_, *model_, batch, out);
    ASSERT_TRUE(st.ok()) << st.message();
    for (int i = 0; i < n; ++i) {
      SCOPED_TRACE("sequence " + std::to_string(i));
      const int keys = caches[size_t(i)]->length();
      EXPECT_EQ(out[size_t(i)].attention.size(),
                size_t(model_->config().n_layer) * model_->config().n_head * keys);
      EXPECT_TRUE(same_bits(out[size_t(i)].attention, ref[size_t(i)].attention[size_t(k)]));
      if (i == 1) {
        EXPECT_TRUE(out[size_t(i)].logits.empty());
      } else {
        EXPECT_TRUE(same_bits(out[size_t(i)].logits, ref[size_t(i)].logits[size_t(k)]));
      }
    }
  }
}

// A's prompt blocks are published; B, whose prompt starts with A's first two blocks,
// finds them by hash, adopts them and prefills only its other 12 tokens, in the same
// pass as A's first decode step. Both then decode together; every step equals a cold
// solo run bit for bit.
TEST_F(ForwardBatchTest, APromptStartingWithPublishedBlocksComputesOnlyTheRest) {
  const int B = 16, L = model_->config().n_layer;
  const std::vector<int32_t> pa = prompt(kTexts[3], 40);
  std::vector<int32_t> pb(pa.begin(), pa.begin() + 2 * B);
  const std::vector<int32_t> tail = prompt(kTexts[0], 12, false);
  pb.insert(pb.end(), tail.begin(), tail.end());
  ASSERT_EQ(pb.size(), 44u);
  const Solo ra = solo(pa, kF16, 4), rb = solo(pb, kF16, 3);
  ASSERT_EQ(ra.tokens.size(), 4u);
  ASSERT_EQ(rb.tokens.size(), 3u);
  auto pool = make_pool(kF16, 16, B);
  ASSERT_TRUE(pool);
  auto a = make_paged(pool, kF16);
  auto b = make_paged(pool, kF16);
  ASSERT_TRUE(a && b);
  const std::vector<const std::vector<int32_t>*> tables = {&a->blocks(), &b->blocks()};

  std::vector<BatchSeqOutput> out;
  BatchSeq sa{a.get(), pa.data(), int(pa.size())};
  ASSERT_TRUE(forward_batch(*be_, *model_, {sa}, out).ok());
  EXPECT_TRUE(same_bits(out[0].logits, ra.logits[0]));
  // A publishes its two full blocks under their chained hashes.
  uint64_t parent = 0;
  for (int i = 0; i < 2; ++i) {
    parent = pool->chain_hash(parent, pa.data() + i * B, B, kSalt);
    pool->publish(a->blocks()[size_t(i)], parent);
  }
  // B looks its own full blocks up: the first two are A's, the third (positions 32..43,
  // not full) is not looked for.
  std::vector<int32_t> found;
  parent = 0;
  for (int i = 0; (i + 1) * B <= int(pb.size()); ++i) {
    parent = pool->chain_hash(parent, pb.data() + i * B, B, kSalt);
    const int blk = pool->lookup(parent);
    if (blk < 0) break;
    found.push_back(blk);
  }
  ASSERT_EQ(found, (std::vector<int32_t>{a->blocks()[0], a->blocks()[1]}));
  ASSERT_TRUE(b->adopt(found, 2 * B).ok());
  for (int32_t blk : found) pool->unref(blk);
  EXPECT_EQ(b->length(), 2 * B);
  Status ok = pool->check(tables);
  ASSERT_TRUE(ok.ok()) << ok.message();

  // One pass: A's decode step and the 12 tokens of B past the shared prefix.
  int32_t next_a = ra.tokens[0];
  const int rest = int(pb.size()) - 2 * B;
  BatchSeq sb{b.get(), pb.data() + 2 * B, rest};
  sb.norms = true;
  ASSERT_TRUE(forward_batch(*be_, *model_, {BatchSeq{a.get(), &next_a, 1}, sb}, out).ok());
  EXPECT_TRUE(same_bits(out[0].logits, ra.logits[1]));
  EXPECT_TRUE(same_bits(out[1].logits, rb.logits[0]));
  // Only B's 12 new tokens went through: their work, their K/V rows (the cold run's last
  // 12 columns of each layer's norms).
  std::vector<KvLayerRule> rules;
  for (int l = 0; l < L; ++l) rules.push_back(b->rule(l));
  EXPECT_EQ(out[1].flops, forward_flops(*model_, rules, rest, 2 * B));
  EXPECT_LT(out[1].flops, rb.flops[0]);
  ASSERT_EQ(out[1].k_norm.size(), size_t(L) * rest);
  for (int l = 0; l < L; ++l)
    for (int t = 0; t < rest; ++t) {
      const size_t cold = size_t(l) * pb.size() + size_t(2 * B + t);
      EXPECT_EQ(out[1].k_norm[size_t(l * rest + t)], rb.k_norm[0][cold]) << l << " " << t;
      EXPECT_EQ(out[1].v_norm[size_t(l * rest + t)], rb.v_norm[0][cold]) << l << " " << t;
    }
  EXPECT_EQ(b->length(), int(pb.size()));
  // The prefix blocks are shared, B's third block is its own; nothing was copied.
  EXPECT_EQ(b->blocks()[0], a->blocks()[0]);
  EXPECT_EQ(b->blocks()[1], a->blocks()[1]);
  EXPECT_NE(b->blocks()[2], a->blocks()[2]);
  EXPECT_EQ(pool->ref_count(a->blocks()[0]), 2);
  EXPECT_EQ(pool->ref_count(a->blocks()[1]), 2);
  EXPECT_EQ(a->cow_copies() + b->cow_copies(), 0);
  ok = pool->check(tables);
  ASSERT_TRUE(ok.ok()) << ok.message();

  // Two more steps together.
  int32_t next_b = rb.tokens[0];
  for (int k = 1; k < 3; ++k) {
    next_a = argmax(out[0].logits);
    next_b = argmax(out[1].logits);
    ASSERT_TRUE(forward_batch(*be_, *model_, {BatchSeq{b.get(), &next_b, 1},
                                              BatchSeq{a.get(), &next_a, 1}},
                              out)
                    .ok());
    EXPECT_TRUE(same_bits(out[0].logits, rb.logits[size_t(k)])) << k;
    EXPECT_TRUE(same_bits(out[1].logits, ra.logits[size_t(k + 1)])) << k;
    std::swap(out[0], out[1]);  // keep out[0] for A
    ok = pool->check(tables);
    ASSERT_TRUE(ok.ok()) << ok.message();
  }
}

// B forks all of A's 20 positions (block 0 full, block 1 half used); then, in one pass,
// each writes a different token at position 20. The first in the batch copies the shared
// partial block, the other writes in place, and each equals its own solo run.
TEST_F(ForwardBatchTest, ForkedSequencesWritingTheSharedBlockInOnePassEachGetTheirOwn) {
  const std::vector<int32_t> pa = prompt(kTexts[2], 20);
  const Solo ra = solo(pa, kF16, 3);
  ASSERT_EQ(ra.tokens.size(), 3u);
  const int32_t y = ra.tokens[0] == 13 ? 14 : 13;  // not A's next token
  std::vector<int32_t> pb = pa;
  pb.push_back(y);
  const Solo rb = solo(pb, kF16, 2);
  ASSERT_EQ(rb.tokens.size(), 2u);
  auto pool = make_pool(kF16, 8);
  ASSERT_TRUE(pool);
  auto a = make_paged(pool, kF16);
  auto b = make_paged(pool, kF16);
  ASSERT_TRUE(a && b);
  const std::vector<const std::vector<int32_t>*> tables = {&a->blocks(), &b->blocks()};
  std::vector<BatchSeqOutput> out;
  ASSERT_TRUE(forward_batch(*be_, *model_, {BatchSeq{a.get(), pa.data(), 20}}, out).ok());
  ASSERT_TRUE(b->adopt(a->blocks(), 20).ok());
  ASSERT_EQ(b->blocks(), a->blocks());
  Status ok = pool->check(tables);
  ASSERT_TRUE(ok.ok()) << ok.message();

  const int32_t xa = ra.tokens[0];
  ASSERT_TRUE(forward_batch(*be_, *model_, {BatchSeq{b.get(), &y, 1}, BatchSeq{a.get(), &xa, 1}},
                            out)
                  .ok());
  EXPECT_TRUE(same_bits(out[0].logits, rb.logits[0]));
  EXPECT_TRUE(same_bits(out[1].logits, ra.logits[1]));
  EXPECT_EQ(b->cow_copies(), 1);
  EXPECT_EQ(a->cow_copies(), 0);
  EXPECT_EQ(a->blocks()[0], b->blocks()[0]);
  EXPECT_NE(a->blocks()[1], b->blocks()[1]);
  EXPECT_EQ(pool->ref_count(a->blocks()[0]), 2);
  ok = pool->check(tables);
  ASSERT_TRUE(ok.ok()) << ok.message();

  const int32_t xb2 = rb.tokens[0], xa2 = ra.tokens[1];
  ASSERT_TRUE(forward_batch(*be_, *model_,
                            {BatchSeq{a.get(), &xa2, 1}, BatchSeq{b.get(), &xb2, 1}}, out)
                  .ok());
  EXPECT_TRUE(same_bits(out[0].logits, ra.logits[2]));
  EXPECT_TRUE(same_bits(out[1].logits, rb.logits[1]));
  ok = pool->check(tables);
  ASSERT_TRUE(ok.ok()) << ok.message();
}

// A batch that names one cache twice is refused before anything runs: every cache keeps
// its length and blocks, and the next good batch still matches the solo runs.
TEST_F(ForwardBatchTest, ABatchNamingACacheTwiceIsRefusedAndChangesNothing) {
  const std::vector<int32_t> pa = prompt(kTexts[5], 5), pb = prompt(kTexts[6], 20);
  const Solo ra = solo(pa, kF16, 2), rb = solo(pb, kF16, 2);
  auto pool = make_pool(kF16, 8);
  ASSERT_TRUE(pool);
  auto a = make_paged(pool, kF16);
  auto b = make_paged(pool, kF16);
  auto flat = be_->create_kv_cache(cache_config(kF16), 64);
  ASSERT_TRUE(a && b && flat.ok());
  std::vector<BatchSeqOutput> out;
  ASSERT_TRUE(forward_batch(*be_, *model_,
                            {BatchSeq{a.get(), pa.data(), 5}, BatchSeq{b.get(), pb.data(), 20},
                             BatchSeq{flat->get(), pa.data(), 5}},
                            out)
                  .ok());
  const std::vector<int32_t> blocks_a = a->blocks(), blocks_b = b->blocks();
  const KvPoolCounts before = pool->counts();
  const int32_t ta = ra.tokens[0], tb = rb.tokens[0];
  for (const auto& bad : {std::vector<BatchSeq>{{a.get(), &ta, 1}, {b.get(), &tb, 1}, {a.get(), &ta, 1}},
                          std::vector<BatchSeq>{{flat->get(), &ta, 1}, {flat->get(), &ta, 1}},
                          std::vector<BatchSeq>{{b.get(), pb.data(), 3}, {b.get(), &tb, 1}}}) {
    out.clear();
    Status st = forward_batch(*be_, *model_, bad, out);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("share a cache"), std::string::npos) << st.message();
    EXPECT_EQ(a->length(), 5);
    EXPECT_EQ(b->length(), 20);
    EXPECT_EQ((*flat)->length(), 5);
    EXPECT_EQ(a->blocks(), blocks_a);
    EXPECT_EQ(b->blocks(), blocks_b);
    EXPECT_EQ(pool->counts().used, before.used);
    Status ok = pool->check({&a->blocks(), &b->blocks()});
    ASSERT_TRUE(ok.ok()) << ok.message();
  }
  ASSERT_TRUE(forward_batch(*be_, *model_,
                            {BatchSeq{a.get(), &ta, 1}, BatchSeq{b.get(), &tb, 1},
                             BatchSeq{flat->get(), &ta, 1}},
                            out)
                  .ok());
  EXPECT_TRUE(same_bits(out[0].logits, ra.logits[1]));
  EXPECT_TRUE(same_bits(out[1].logits, rb.logits[1]));
  EXPECT_TRUE(same_bits(out[2].logits, ra.logits[1]));
}

// A batch the pool cannot hold: A's decode step would take a third block, B's prompt
// three more, and the pool has four. The batch fails, and A keeps exactly its two blocks
// and its positions (no block taken for the step that did not happen); A alone then
// decodes as its solo run does.
TEST_F(ForwardBatchTest, ABatchThePoolCannotHoldIsRefusedAndKeepsNoBlock) {
  const int B = 16;
  const std::vector<int32_t> pa = prompt(kTexts[1], 2 * B), pb = prompt(kTexts[3], 40);
  const Solo ra = solo(pa, kF16, 2);
  auto pool = make_pool(kF16, 4, B);
  ASSERT_TRUE(pool);
  auto a = make_paged(pool, kF16);
  auto b = make_paged(pool, kF16);
  ASSERT_TRUE(a && b);
  std::vector<BatchSeqOutput> out;
  ASSERT_TRUE(forward_batch(*be_, *model_, {BatchSeq{a.get(), pa.data(), 2 * B}}, out).ok());
  const std::vector<int32_t> blocks_a = a->blocks();
  ASSERT_EQ(blocks_a.size(), 2u);
  const int32_t ta = ra.tokens[0];
  Status st = forward_batch(
      *be_, *model_, {BatchSeq{a.get(), &ta, 1}, BatchSeq{b.get(), pb.data(), int(pb.size())}},
      out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("in use"), std::string::npos) << st.message();
  EXPECT_EQ(a->length(), 2 * B);
  EXPECT_EQ(a->blocks(), blocks_a);
  EXPECT_EQ(b->length(), 0);
  EXPECT_TRUE(b->blocks().empty());
  EXPECT_EQ(pool->available(), 2);
  for (int l = 0; l < a->shape().n_layer; ++l)
    EXPECT_EQ(a->held_ranges(l), (std::vector<KvRange>{{0, 2 * B}}));
  Status ok = pool->check({&a->blocks(), &b->blocks()});
  ASSERT_TRUE(ok.ok()) << ok.message();
  ASSERT_TRUE(forward_batch(*be_, *model_, {BatchSeq{a.get(), &ta, 1}}, out).ok());
  EXPECT_TRUE(same_bits(out[0].logits, ra.logits[1]));
  EXPECT_EQ(a->blocks().size(), 3u);
}

}  // namespace
}  // namespace kvscope
