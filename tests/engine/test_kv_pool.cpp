// test_kv_pool.cpp — the KV block pool and paged caches over it on the CPU backend, no
// model needed: allocate() hands out the lowest free id first and fails when every block
// is in use; a published block whose count drops to 0 stays cached until lookup() revives
// it or allocate() evicts it (least recently used first, free blocks before any cached
// one); check() accepts the states that are right and names a table that disagrees with
// the counts; chain_hash() changes with the parent, the ids, the salt and the pool's
// configuration. Paged caches (f16 and q8_0 rows) read back what was written, take one
// block per block_size positions, share a forked prefix and copy a shared or published
// block before writing into it, give blocks back on truncate and release, and a failed
// begin() for want of blocks keeps none. A seeded random run of create / append / fork /
// truncate / release / publish / lookup keeps check() passing and every cache's rows
// equal to what was written for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <unordered_map>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_kv_cache.h"
#include "engine/kv_pool.h"

namespace kvscope {

// The test parameter's name in failure messages.
void PrintTo(const KvTypes& t, std::ostream* os) { *os << kv_types_name(t); }

namespace {

constexpr KvShape kShape{2, 2, 64};  // 2 layers, 2 kv heads, head_dim 64
constexpr KvTypes kF16{KvDtype::F16, KvDtype::F16};
constexpr KvTypes kQ8{KvDtype::Q8_0, KvDtype::Q8_0};
constexpr uint64_t kSalt = 7;

std::shared_ptr<KvPool> make_pool(Backend& be, KvTypes types, int block_size, int n_blocks,
                                  KvShape shape = kShape) {
  auto p = be.create_kv_pool(KvPoolConfig{shape, types, block_size, n_blocks});
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? p.value() : nullptr;
}

std::unique_ptr<KvCache> make_paged(Backend& be, const std::shared_ptr<KvPool>& pool) {
  auto c = be.create_paged_kv_cache(kv_config_full(pool->config().shape, pool->config().types),
                                    pool);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? std::move(c.value()) : nullptr;
}

// A block from allocate(), -1 when it fails.
int alloc(KvPool& pool) {
  auto b = pool.allocate();
  return b.ok() ? *b : -1;
}

// The fp32 values of the row a tag names, for layer l, kv head h, side 0 (K) or 1 (V):
// multiples of 1/8 in [-16, 16), exact in f16; q8_0 rounds them, the same way each time.
float tag_value(uint32_t tag, int l, int h, int side, int i) {
  const uint32_t x = tag * 2654435761u + uint32_t(l) * 131u + uint32_t(h) * 17u +
                     uint32_t(side) * 7919u + uint32_t(i) * 3u;
  return float(int((x >> 7) % 256u) - 128) / 8.0f;
}

// The bytes a row named by `tag` is stored as, per (layer, head, side), computed apart
// from the cache (cpu::store_row) and remembered.
class Rows {
 public:
  explicit Rows(KvTypes types) : types_(types) {}
  const std::vector<uint8_t>& bytes(uint32_t tag, int l, int h, int side) {
    auto& v = memo_[key(tag, l, h, side)];
    if (v.empty()) {
      const KvDtype t = side == 0 ? types_.k : types_.v;
      std::vector<float> f(static_cast<size_t>(kShape.head_dim));
      for (int i = 0; i < kShape.head_dim; ++i) f[size_t(i)] = tag_value(tag, l, h, side, i);
      v.resize(kv_row_bytes(t, kShape.head_dim));
      cpu::store_row(t, f.data(), v.data(), kShape.head_dim);
    }
    return v;
  }

 private:
  static uint64_t key(uint32_t tag, int l, int h, int side) {
    return (uint64_t(tag) << 8) | uint64_t(l << 4 | h << 1 | side);
  }
  KvTypes types_;
  std::unordered_map<uint64_t, std::vector<uint8_t>> memo_;
};

// Writes positions length() .. length()+tags.size()-1 with the rows `tags` name, through
// the forward's protocol: begin(), the backend's kv_write for every layer, end().
Status append(Backend& be, KvCache& c, const std::vector<uint32_t>& tags) {
  const int T = int(tags.size()), pos0 = c.length();
  const int W = kShape.n_head_kv * kShape.head_dim, D = kShape.head_dim;
  KV_TRY(c.begin(pos0, T));
  std::vector<float> k(size_t(T) * W), v(size_t(T) * W);
  for (int l = 0; l < kShape.n_layer; ++l) {
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < kShape.n_head_kv; ++h)
        for (int i = 0; i < D; ++i) {
          k[size_t(t * W + h * D + i)] = tag_value(tags[size_t(t)], l, h, 0, i);
          v[size_t(t * W + h * D + i)] = tag_value(tags[size_t(t)], l, h, 1, i);
        }
    Status s = be.kv_write(c, l, Tensor{k.data(), T, W}, Tensor{v.data(), T, W}, pos0);
    if (!s.ok()) {
      c.cancel();
      return s;
    }
  }
  return c.end();
}

std::vector<uint32_t> tag_run(uint32_t first, int n) {
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + uint32_t(i);
  return t;
}

// Every position of `c` holds the rows `tags` name (read back through the CPU cache's
// rows at the block table's physical slots).
::testing::AssertionResult rows_are(const KvCache& c, const std::vector<uint32_t>& tags,
                                    Rows& rows) {
  if (c.length() != int(tags.size()))
    return ::testing::AssertionFailure() << "length " << c.length() << ", expected " << tags.size();
  const auto& cc = static_cast<const cpu::CpuKvCache&>(c);
  for (int l = 0; l < kShape.n_layer; ++l)
    for (int p = 0; p < c.length(); ++p) {
      const int s = c.slot_of(l, p);
      if (s < 0 || s >= c.n_slots(l) || c.slot_pos(l)[size_t(s)] != p)
        return ::testing::AssertionFailure() << "layer " << l << " does not hold position " << p;
      for (int h = 0; h < kShape.n_head_kv; ++h)
        for (int side = 0; side < 2; ++side) {
          const auto& want = rows.bytes(tags[size_t(p)], l, h, side);
          const uint8_t* got = side == 0 ? cc.k_row(l, h, s) : cc.v_row(l, h, s);
          if (std::memcmp(got, want.data(), want.size()) != 0)
            return ::testing::AssertionFailure()
                   << (side == 0 ? "K" : "V") << " row of position " << p << " (layer " << l
                   << ", head " << h << ", physical slot " << c.physical_slot(s)
                   << ") is not the one written (tag " << tags[size_t(p)] << ")";
        }
    }
  return ::testing::AssertionSuccess();
}

// Block `b` of the pool holds the rows `tags` (block_size of them) name.
::testing::AssertionResult block_is(const KvPool& pool, int b, const std::vector<uint32_t>& tags,
                                    Rows& rows) {
  const auto& cp = static_cast<const cpu::CpuKvPool&>(pool);
  const int B = pool.block_size();
  for (int i = 0; i < B; ++i)
    for (int l = 0; l < kShape.n_layer; ++l)
      for (int h = 0; h < kShape.n_head_kv; ++h)
        for (int side = 0; side < 2; ++side) {
          const auto& want = rows.bytes(tags[size_t(i)], l, h, side);
          const uint8_t* got = side == 0 ? cp.k_row(l, h, b * B + i) : cp.v_row(l, h, b * B + i);
          if (std::memcmp(got, want.data(), want.size()) != 0)
            return ::testing::AssertionFailure() << "row " << i << " of block " << b
                                                 << " is not the one published (tag "
                                                 << tags[size_t(i)] << ")";
        }
  return ::testing::AssertionSuccess();
}

// The chain of hashes of the full blocks of `tags` (as token ids).
std::vector<uint64_t> chain(const KvPool& pool, const std::vector<uint32_t>& tags) {
  std::vector<uint64_t> out;
  const int B = pool.block_size();
  std::vector<int32_t> ids(tags.begin(), tags.end());
  uint64_t parent = 0;
  for (int i = 0; (i + 1) * B <= int(ids.size()); ++i) {
    parent = pool.chain_hash(parent, ids.data() + i * B, B, kSalt);
    out.push_back(parent);
  }
  return out;
}

::testing::AssertionResult pool_ok(const KvPool& pool,
                                   const std::vector<const std::vector<int32_t>*>& tables) {
  Status s = pool.check(tables);
  if (!s.ok()) return ::testing::AssertionFailure() << s.message();
  const KvPoolCounts c = pool.counts();
  if (c.used + c.free + c.cached != c.total || c.total != pool.n_blocks())
    return ::testing::AssertionFailure() << "used " << c.used << " + free " << c.free
                                         << " + cached " << c.cached << " != " << c.total;
  return ::testing::AssertionSuccess();
}

// --- The pool's bookkeeping.

TEST(KvPool, AllocateHandsOutTheLowestFreeIdAndFailsWhenFull) {
  auto be = make_cpu_backend(1);
  auto pool = make_pool(*be, kF16, 8, 4);
  ASSERT_TRUE(pool);
  std::vector<int32_t> held;
  for (int i = 0; i < 4; ++i) {
    auto b = pool->allocate();
    ASSERT_TRUE(b.ok()) << b.error().message;
    EXPECT_EQ(*b, i);
    EXPECT_EQ(pool->ref_count(*b), 1);
    held.push_back(*b);
    EXPECT_TRUE(pool_ok(*pool, {&held}));
  }
  EXPECT_EQ(pool->available(), 0);
  auto full = pool->allocate();
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message.find("all 4 blocks"), std::string::npos) << full.error().message;
  EXPECT_TRUE(pool_ok(*pool, {&held}));
  // Freed out of order, handed out again lowest first.
  pool->unref(3);
  pool->unref(1);
  held = {0, 2};
  EXPECT_EQ(pool->counts().free, 2);
  EXPECT_TRUE(pool_ok(*pool, {&held}));
  EXPECT_EQ(alloc(*pool), 1);
  EXPECT_EQ(alloc(*pool), 3);
  held = {0, 1, 2, 3};
  EXPECT_TRUE(pool_ok(*pool, {&held}));
  // A second reference, then both dropped.
  pool->ref(2);
  held.push_back(2);
  EXPECT_EQ(pool->ref_count(2), 2);
  EXPECT_TRUE(pool_ok(*pool, {&held}));
  pool->unref(2);
  pool->unref(2);
  held = {0, 1, 3};
  EXPECT_EQ(pool->counts().free, 1);
  EXPECT_TRUE(pool_ok(*pool, {&held}));
}

TEST(KvPool, PublishedBlocksAreCachedRevivedAndEvictedLeastRecentlyUsedFirst) {
  auto be = make_cpu_backend(1);
  auto pool = make_pool(*be, kF16, 8, 4);
  ASSERT_TRUE(pool);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(alloc(*pool), i);
  const int32_t ids0[8] = {1, 2, 3, 4, 5, 6, 7, 8}, ids2[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  const uint64_t h0 = pool->chain_hash(0, ids0, 8, kSalt);
  const uint64_t h2 = pool->chain_hash(0, ids2, 8, kSalt);
  ASSERT_NE(h0, h2);
  pool->publish(0, h0);
  pool->publish(2, h2);
  EXPECT_TRUE(pool->published(0));
  EXPECT_FALSE(pool->published(1));
  // Publishing a taken hash, or a published block again, changes nothing.
  pool->publish(1, h0);
  pool->publish(0, h2);
  EXPECT_FALSE(pool->published(1));
  std::vector<int32_t> held = {0, 1, 2, 3};
  EXPECT_TRUE(pool_ok(*pool, {&held}));

  // Unreferenced, the published blocks stay cached (LRU order 0, 2); block 1 is free.
  pool->unref(0);
  pool->unref(2);
  pool->unref(1);
  held = {3};
  KvPoolCounts c = pool->counts();
  EXPECT_EQ(c.cached, 2);
  EXPECT_EQ(c.free, 1);
  EXPECT_EQ(c.used, 1);
  EXPECT_EQ(pool->available(), 3);
  EXPECT_TRUE(pool_ok(*pool, {&held}));

  // lookup() revives block 0 (count 1, off the LRU list); dropped again it becomes the
  // most recently used, so the LRU order is now 2, 0.
  EXPECT_EQ(pool->lookup(h0), 0);
  EXPECT_EQ(pool->ref_count(0), 1);
  EXPECT_EQ(pool->counts().cached, 1);
  held = {3, 0};
  EXPECT_TRUE(pool_ok(*pool, {&held}));
  pool->unref(0);
  held = {3};
  EXPECT_EQ(pool->counts().cached, 2);
  EXPECT_EQ(pool->lookup(12345), -1);

  // The free block goes first; no cached block is evicted while one is free.
  EXPECT_EQ(alloc(*pool), 1);
  held = {3, 1};
  EXPECT_EQ(pool->counts().cached, 2);
  EXPECT_EQ(pool->lookup(h2), 2);
  pool->unref(2);  // touched: the LRU order is 0, 2 again
  EXPECT_TRUE(pool_ok(*pool, {&held}));

  // Then the least recently used cached block (0): its hash no longer resolves.
  EXPECT_EQ(alloc(*pool), 0);
  held = {3, 1, 0};
  EXPECT_FALSE(pool->published(0));
  EXPECT_EQ(pool->lookup(h0), -1);
  EXPECT_EQ(pool->counts().cached, 1);
  EXPECT_TRUE(pool_ok(*pool, {&held}));
  EXPECT_EQ(alloc(*pool), 2);
  held = {3, 1, 0, 2};
  EXPECT_EQ(pool->lookup(h2), -1);
  EXPECT_FALSE(pool->allocate().ok());
  EXPECT_TRUE(pool_ok(*pool, {&held}));

  // An evicted hash may name a new block.
  pool->publish(1, h0);
  EXPECT_EQ(pool->lookup(h0), 1);
  held.push_back(1);
  EXPECT_EQ(pool->ref_count(1), 2);
  EXPECT_TRUE(pool_ok(*pool, {&held}));
}

TEST(KvPool, CheckFindsTablesThatDisagreeWithTheCounts) {
  auto be = make_cpu_backend(1);
  auto pool = make_pool(*be, kF16, 8, 4);
  ASSERT_TRUE(pool);
  ASSERT_EQ(alloc(*pool), 0);
  ASSERT_EQ(alloc(*pool), 1);
  pool->ref(1);
  // Block 0 has count 1, block 1 count 2.
  const std::vector<int32_t> a = {0, 1}, b = {1};
  EXPECT_TRUE(pool->check({&a, &b}).ok()) << pool->check({&a, &b}).message();

  // A table missing: block 1 has count 2 but one entry points to it.
  Status missing = pool->check({&a});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("block 1 has count 2 but 1 table entries"), std::string::npos)
      << missing.message();
  // A table with an entry too many: block 0 twice.
  const std::vector<int32_t> twice = {0, 0};
  Status extra = pool->check({&twice, &b, &b});
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.message().find("block 0 has count 1 but 2"), std::string::npos)
      << extra.message();
  // A table pointing at a free block.
  const std::vector<int32_t> to_free = {2};
  EXPECT_FALSE(pool->check({&a, &b, &to_free}).ok());
  // A table pointing outside the pool.
  const std::vector<int32_t> outside = {4};
  Status out = pool->check({&a, &b, &outside});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.message().find("block 4 of 4"), std::string::npos) << out.message();
  // No table at all while blocks are in use.
  EXPECT_FALSE(pool->check({}).ok());

  // And the valid state after everything is given back.
  pool->unref(0);
  pool->unref(1);
  pool->unref(1);
  EXPECT_TRUE(pool->check({}).ok());
  EXPECT_EQ(pool->counts().free, 4);
}

TEST(KvPool, ChainHashDependsOnParentIdsSaltAndConfiguration) {
  auto be = make_cpu_backend(1);
  auto p16 = make_pool(*be, kF16, 16, 2);
  auto p16b = make_pool(*be, kF16, 16, 5);  // only the block count differs
  auto p8 = make_pool(*be, kF16, 8, 2);
  auto q8 = make_pool(*be, kQ8, 16, 2);
  auto kq = make_pool(*be, KvTypes{KvDtype::Q8_0, KvDtype::F16}, 16, 2);
  auto wide = make_pool(*be, kF16, 16, 2, KvShape{2, 4, 64});
  auto deep = make_pool(*be, kF16, 16, 2, KvShape{3, 2, 64});
  ASSERT_TRUE(p16 && p16b && p8 && q8 && kq && wide && deep);
  std::vector<int32_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[size_t(i)] = 100 + i;
  const uint64_t h = p16->chain_hash(0, ids.data(), 16, kSalt);
  EXPECT_NE(h, 0u);
  // Deterministic, and the same on another pool of the same configuration.
  EXPECT_EQ(p16->chain_hash(0, ids.data(), 16, kSalt), h);
  EXPECT_EQ(p16b->chain_hash(0, ids.data(), 16, kSalt), h);
  // Each input changes it.
  EXPECT_NE(p16->chain_hash(h, ids.data(), 16, kSalt), h);
  EXPECT_NE(p16->chain_hash(1, ids.data(), 16, kSalt), h);
  EXPECT_NE(p16->chain_hash(0, ids.data(), 16, kSalt + 1), h);
  EXPECT_NE(p16->chain_hash(0, ids.data(), 15, kSalt), h);
  std::vector<int32_t> other = ids;
  other[15] += 1;
  EXPECT_NE(p16->chain_hash(0, other.data(), 16, kSalt), h);
  other = ids;
  std::swap(other[0], other[1]);
  EXPECT_NE(p16->chain_hash(0, other.data(), 16, kSalt), h);
  for (const auto& p : {p8, q8, kq, wide, deep})
    EXPECT_NE(p->chain_hash(0, ids.data(), 16, kSalt), h);
  // A chain: the second block's hash depends on the first block's ids through the parent.
  const uint64_t h_next = p16->chain_hash(h, ids.data(), 16, kSalt);
  const uint64_t h_other = p16->chain_hash(0, other.data(), 16, kSalt);
  EXPECT_NE(p16->chain_hash(h_other, ids.data(), 16, kSalt), h_next);
}

// --- Paged caches.

class PagedCache : public ::testing::TestWithParam<KvTypes> {
 protected:
  std::unique_ptr<Backend> be_ = make_cpu_backend(1);
  Rows rows_{GetParam()};
};

TEST_P(PagedCache, RowsReadBackAndTheTableGrowsOneBlockPerBlockSize) {
  const int B = 16;
  auto pool = make_pool(*be_, GetParam(), B, 8);
  ASSERT_TRUE(pool);
  auto a = make_paged(*be_, pool);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->paged());
  EXPECT_EQ(a->pool(), pool.get());
  std::vector<uint32_t> tags;
  uint32_t next = 1;
  for (int T : {5, 11, 1, 15, 1, 30, 3}) {
    const auto more = tag_run(next, T);
    next += uint32_t(T);
    ASSERT_TRUE(append(*be_, *a, more).ok());
    tags.insert(tags.end(), more.begin(), more.end());
    const int n = int(tags.size());
    SCOPED_TRACE(n);
    ASSERT_EQ(int(a->blocks().size()), kv_blocks_for(n, B));
    for (size_t i = 0; i < a->blocks().size(); ++i) EXPECT_EQ(a->blocks()[i], int(i));
    for (int l = 0; l < kShape.n_layer; ++l) {
      EXPECT_EQ(a->n_slots(l), int(a->blocks().size()) * B);
      EXPECT_EQ(a->held_ranges(l), (std::vector<KvRange>{{0, n}}));
    }
    EXPECT_EQ(a->physical_slot(n - 1), a->blocks()[size_t((n - 1) / B)] * B + (n - 1) % B);
    EXPECT_EQ(pool->counts().used, int(a->blocks().size()));
    EXPECT_TRUE(rows_are(*a, tags, rows_));
    EXPECT_TRUE(pool_ok(*pool, {&a->blocks()}));
  }
  // The backend's row norms read the same rows (the attention kernels' addressing).
  const int n = a->length();
  std::vector<float> kn(static_cast<size_t>(n)), vn(static_cast<size_t>(n));
  std::vector<float> row(static_cast<size_t>(kShape.head_dim));
  for (int l = 0; l < kShape.n_layer; ++l) {
    ASSERT_TRUE(be_->kv_row_norms(*a, l, 0, n, Tensor{kn.data(), 1, n}, Tensor{vn.data(), 1, n}).ok());
    for (int p = 0; p < n; ++p) {
      double sk = 0, sv = 0;
      for (int h = 0; h < kShape.n_head_kv; ++h) {
        cpu::load_row(GetParam().k, rows_.bytes(tags[size_t(p)], l, h, 0).data(), row.data(),
                      kShape.head_dim);
        for (float f : row) sk += double(f) * f;
        cpu::load_row(GetParam().v, rows_.bytes(tags[size_t(p)], l, h, 1).data(), row.data(),
                      kShape.head_dim);
        for (float f : row) sv += double(f) * f;
      }
      EXPECT_EQ(kn[size_t(p)], float(std::sqrt(sk))) << "layer " << l << " pos " << p;
      EXPECT_EQ(vn[size_t(p)], float(std::sqrt(sv))) << "layer " << l << " pos " << p;
    }
  }
  // A pool of another type, or whose blocks hold another number of layers than the
  // cache's layer groups, is refused.
  auto other = make_pool(*be_, GetParam() == kF16 ? kQ8 : kF16, B, 2);
  EXPECT_FALSE(be_->create_paged_kv_cache(kv_config_full(kShape, GetParam()), other).ok());
  KvCacheConfig windowed = kv_config_full(kShape, GetParam());
  windowed.layers[1] = KvLayerRule{8, 0, 8};  // two groups of one layer
  EXPECT_FALSE(be_->create_paged_kv_cache(windowed, pool).ok());
}

// A context shift forgets positions [first, first + n) and moves every later row down by
// n, inside the pool's blocks: blocks past the new length go back, a block another cache
// shares (or the prefix cache holds) is copied before rows move into it, and the other
// cache's rows stay as they were. Small shifts (n below the block size) move rows inside
// one block.
TEST_P(PagedCache, AShiftMovesLaterRowsDownCopyingSharedBlocksAndGivesBackTheTail) {
  const int B = 8;
  auto pool = make_pool(*be_, GetParam(), B, 16);
  ASSERT_TRUE(pool);
  auto a = make_paged(*be_, pool);
  auto b = make_paged(*be_, pool);
  ASSERT_TRUE(a && b);
  const auto tables = [&] {
    return std::vector<const std::vector<int32_t>*>{&a->blocks(), &b->blocks()};
  };
  std::vector<uint32_t> ta = tag_run(1, 45);  // 6 blocks, the last holding 5
  ASSERT_TRUE(append(*be_, *a, ta).ok());
  const std::vector<uint32_t> tb(ta.begin(), ta.begin() + 24);
  ASSERT_TRUE(b->adopt({a->blocks()[0], a->blocks()[1], a->blocks()[2]}, 24).ok());
  const auto hashes = chain(*pool, ta);
  pool->publish(a->blocks()[3], hashes[3]);  // block 3 is in the prefix cache
  const int published = a->blocks()[3];
  ASSERT_TRUE(pool_ok(*pool, tables()));

  // Drop [3, 16): 32 positions stay, in 4 blocks; blocks 0-2 are shared with b and block
  // 3 is published, so rows move into copies of all four.
  ASSERT_TRUE(a->shift(3, 13).ok());
  std::vector<uint32_t> want(ta.begin(), ta.begin() + 3);
  want.insert(want.end(), ta.begin() + 16, ta.end());
  EXPECT_EQ(a->length(), 32);
  EXPECT_EQ(a->blocks().size(), 4u);
  EXPECT_EQ(a->cow_copies(), 4);
  EXPECT_TRUE(rows_are(*a, want, rows_));
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(block_is(*pool, published, std::vector<uint32_t>(ta.begin() + 24, ta.begin() + 32),
                       rows_));
  EXPECT_EQ(pool->counts().used, 4 + 3);
  EXPECT_EQ(pool->counts().cached, 1);
  for (int l = 0; l < kShape.n_layer; ++l)
    EXPECT_EQ(a->held_ranges(l), (std::vector<KvRange>{{0, 32}}));
  EXPECT_EQ(a->layer_bytes(0), 4u * B * kv_position_bytes(kShape, GetParam()));
  EXPECT_TRUE(pool_ok(*pool, tables()));

  // A cache of its own, small shifts: rows move inside and across blocks in runs no
  // longer than the shift, which never overwrite a row still to be read.
  for (int first : {0, 2, 7})
    for (int n : {1, 3, 8, 11}) {
      SCOPED_TRACE(std::to_string(first) + " + " + std::to_string(n));
      auto c = make_paged(*be_, pool);
      std::vector<uint32_t> tc = tag_run(100, 29);
      ASSERT_TRUE(append(*be_, *c, tc).ok());
      ASSERT_TRUE(c->shift(first, n).ok());
      tc.erase(tc.begin() + first, tc.begin() + first + n);
      EXPECT_TRUE(rows_are(*c, tc, rows_));
      EXPECT_EQ(int(c->blocks().size()), kv_blocks_for(29 - n, B));
      EXPECT_EQ(c->cow_copies(), 0);
      // Writing on after the shift continues at the new length.
      ASSERT_TRUE(append(*be_, *c, {900, 901}).ok());
      tc.push_back(900);
      tc.push_back(901);
      EXPECT_TRUE(rows_are(*c, tc, rows_));
      EXPECT_TRUE(pool_ok(*pool, {&a->blocks(), &b->blocks(), &c->blocks()}));
    }
  EXPECT_FALSE(a->shift(30, 3).ok()) << "past the end";
  EXPECT_FALSE(a->shift(0, 0).ok());
  EXPECT_TRUE(rows_are(*a, want, rows_));
}

// A layer that keeps only its window (keep > 0: a sink + window setting, or Gemma 3's local
// layers under the window policy) gives back each block once no later query can see any
// of it, at the end of the step that makes it so; its sinks' blocks stay. KV_CACHE counts
// the blocks held.
TEST_P(PagedCache, ALayerThatKeepsItsWindowGivesBackBlocksOutsideItAndKeepsItsSinks) {
  const int B = 8, W = 12;
  const KvShape one{1, kShape.n_head_kv, kShape.head_dim};
  auto pool = make_pool(*be_, GetParam(), B, 32, one);
  ASSERT_TRUE(pool);
  for (int sink : {0, 4}) {
    SCOPED_TRACE("sink " + std::to_string(sink));
    KvCacheConfig cfg = kv_config_full(kShape, GetParam());
    cfg.layers[1] = KvLayerRule{W, sink, W};  // layer 0 keeps everything
    auto made = be_->create_paged_kv_cache(cfg, pool);
    ASSERT_TRUE(made.ok()) << made.error().message;
    KvCache& c = **made;
    ASSERT_EQ(c.n_groups(), 2);
    const uint64_t pos_bytes = kv_position_bytes(kShape, GetParam());
    for (int n = 1; n <= 60; ++n) {
      ASSERT_TRUE(append(*be_, c, {uint32_t(n)}).ok());
      // By hand: the oldest key a query at n sees is n - W + 1; blocks wholly below it
      // (and not holding a sink) are gone.
      const int lo_block = std::max(0, n - W + 1) / B;
      std::vector<KvRange> want;
      if (sink > 0 && lo_block > 0) want.push_back({0, B});
      want.push_back({lo_block * B, n});
      if (want.size() == 2 && want[0].end == want[1].begin) want = {{0, n}};
      EXPECT_EQ(c.held_ranges(1), want) << "n " << n;
      EXPECT_EQ(c.held_ranges(0), (std::vector<KvRange>{{0, n}}));
      const int blocks1 = kv_blocks_for(n, B) - lo_block + (sink > 0 && lo_block > 0 ? 1 : 0);
      EXPECT_EQ(c.layer_bytes(1), uint64_t(blocks1) * B * pos_bytes) << "n " << n;
      EXPECT_EQ(c.layer_bytes(0), uint64_t(kv_blocks_for(n, B)) * B * pos_bytes);
      EXPECT_EQ(pool->counts().used, kv_blocks_for(n, B) + blocks1);
      EXPECT_TRUE(pool_ok(*pool, {&c.blocks(0), &c.blocks(1)}));
    }
  }
  EXPECT_EQ(pool->counts().free, 32) << "the caches gave every block back";
}

TEST_P(PagedCache, AForkSharesFullBlocksAndCopiesThePartialOneBeforeWriting) {
  const int B = 16;
  auto pool = make_pool(*be_, GetParam(), B, 12);
  ASSERT_TRUE(pool);
  auto a = make_paged(*be_, pool);
  auto b = make_paged(*be_, pool);
  auto c = make_paged(*be_, pool);
  ASSERT_TRUE(a && b && c);
  const auto tables = [&] {
    return std::vector<const std::vector<int32_t>*>{&a->blocks(), &b->blocks(), &c->blocks()};
  };
  std::vector<uint32_t> ta = tag_run(1, 40);  // blocks 0, 1 full, 2 holds 8
  ASSERT_TRUE(append(*be_, *a, ta).ok());
  ASSERT_EQ(a->blocks(), (std::vector<int32_t>{0, 1, 2}));

  // b forks all of a (mid-block): every block is shared, nothing computed.
  ASSERT_TRUE(b->adopt(a->blocks(), 40).ok());
  EXPECT_EQ(b->length(), 40);
  EXPECT_EQ(b->blocks(), a->blocks());
  for (int32_t blk : a->blocks()) EXPECT_EQ(pool->ref_count(blk), 2);
  EXPECT_EQ(pool->counts().used, 3);
  std::vector<uint32_t> tb = ta;
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(pool_ok(*pool, tables()));

  // Both write position 40, different rows. a writes first: it copies the shared
  // partial block; then b's is its own and it writes in place.
  ASSERT_TRUE(append(*be_, *a, {1000}).ok());
  ta.push_back(1000);
  EXPECT_EQ(a->cow_copies(), 1);
  EXPECT_TRUE(pool_ok(*pool, tables()));
  ASSERT_TRUE(append(*be_, *b, {2000}).ok());
  tb.push_back(2000);
  EXPECT_EQ(b->cow_copies(), 0);
  EXPECT_TRUE(pool_ok(*pool, tables()));
  // The full blocks are still the same physical blocks, the partial one was copied.
  EXPECT_EQ(a->blocks()[0], b->blocks()[0]);
  EXPECT_EQ(a->blocks()[1], b->blocks()[1]);
  EXPECT_NE(a->blocks()[2], b->blocks()[2]);
  EXPECT_EQ(b->blocks()[2], 2);
  EXPECT_EQ(pool->ref_count(a->blocks()[0]), 2);
  EXPECT_EQ(pool->ref_count(a->blocks()[2]), 1);
  EXPECT_EQ(pool->ref_count(b->blocks()[2]), 1);
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_TRUE(rows_are(*b, tb, rows_));

  // c forks the first 24 positions of a (blocks 0 and 1, the second half used) and writes
  // on: block 1 is copied, block 0 stays shared three ways; a and b are untouched.
  ASSERT_TRUE(c->adopt({a->blocks()[0], a->blocks()[1]}, 24).ok());
  std::vector<uint32_t> tc(ta.begin(), ta.begin() + 24);
  EXPECT_TRUE(rows_are(*c, tc, rows_));
  const auto more = tag_run(3000, 20);
  ASSERT_TRUE(append(*be_, *c, more).ok());
  tc.insert(tc.end(), more.begin(), more.end());
  EXPECT_EQ(c->cow_copies(), 1);
  EXPECT_EQ(c->blocks()[0], a->blocks()[0]);
  EXPECT_NE(c->blocks()[1], a->blocks()[1]);
  EXPECT_EQ(pool->ref_count(a->blocks()[0]), 3);
  EXPECT_EQ(pool->ref_count(a->blocks()[1]), 2);
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(rows_are(*c, tc, rows_));
  EXPECT_TRUE(pool_ok(*pool, tables()));

  // adopt() refuses a cache that holds positions, a table of the wrong length, a block not
  // in use; the cache is unchanged after each.
  EXPECT_FALSE(c->adopt(a->blocks(), 41).ok());
  EXPECT_TRUE(rows_are(*c, tc, rows_));
  auto d = make_paged(*be_, pool);
  EXPECT_FALSE(d->adopt(a->blocks(), 20).ok());
  EXPECT_FALSE(d->adopt({11}, 5).ok());
  EXPECT_EQ(d->length(), 0);
  EXPECT_TRUE(d->blocks().empty());
  EXPECT_TRUE(pool_ok(*pool, {&a->blocks(), &b->blocks(), &c->blocks(), &d->blocks()}));

  // Releasing a leaves the blocks b and c still use.
  a->release();
  EXPECT_EQ(a->length(), 0);
  EXPECT_TRUE(a->blocks().empty());
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(rows_are(*c, tc, rows_));
  EXPECT_TRUE(pool_ok(*pool, tables()));
  b.reset();  // the destructor releases too
  c->release();
  EXPECT_TRUE(pool_ok(*pool, {&a->blocks()}));
  EXPECT_EQ(pool->counts().free, 12);
}

TEST_P(PagedCache, TruncateGivesBackWholeBlocksAndAPublishedBlockIsNeverOverwritten) {
  const int B = 8;
  auto pool = make_pool(*be_, GetParam(), B, 8);
  ASSERT_TRUE(pool);
  auto a = make_paged(*be_, pool);
  ASSERT_TRUE(a);
  std::vector<uint32_t> ta = tag_run(1, 30);  // 4 blocks, the last holds 6
  ASSERT_TRUE(append(*be_, *a, ta).ok());
  ASSERT_EQ(a->blocks().size(), 4u);
  ASSERT_TRUE(a->truncate(17).ok());  // position 16 is in block 2: 3 blocks stay
  ta.resize(17);
  EXPECT_EQ(a->blocks().size(), 3u);
  EXPECT_EQ(pool->counts().free, 5);
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_TRUE(pool_ok(*pool, {&a->blocks()}));
  ASSERT_TRUE(a->truncate(16).ok());
  ta.resize(16);
  EXPECT_EQ(a->blocks().size(), 2u);
  for (int l = 0; l < kShape.n_layer; ++l) EXPECT_EQ(a->n_slots(l), 16);
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_FALSE(a->truncate(17).ok());
  // Written on: the freed block 2 comes back first.
  auto more = tag_run(100, 4);
  ASSERT_TRUE(append(*be_, *a, more).ok());
  ta.insert(ta.end(), more.begin(), more.end());
  EXPECT_EQ(a->blocks(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_EQ(a->cow_copies(), 0);

  // Both full blocks published; a truncated into block 1 then written on copies it first
  // (its rows must stay what the hash says), and the original, unreferenced, is cached.
  const auto hs = chain(*pool, ta);
  ASSERT_EQ(hs.size(), 2u);
  pool->publish(a->blocks()[0], hs[0]);
  pool->publish(a->blocks()[1], hs[1]);
  const std::vector<uint32_t> block1(ta.begin() + 8, ta.begin() + 16);
  ASSERT_TRUE(a->truncate(12).ok());
  ta.resize(12);
  more = tag_run(200, 2);
  ASSERT_TRUE(append(*be_, *a, more).ok());
  ta.insert(ta.end(), more.begin(), more.end());
  EXPECT_EQ(a->cow_copies(), 1);
  EXPECT_NE(a->blocks()[1], 1);
  EXPECT_EQ(pool->counts().cached, 1);
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_TRUE(pool_ok(*pool, {&a->blocks()}));
  EXPECT_TRUE(block_is(*pool, 1, block1, rows_));
  // A new sequence with the same first 16 tokens finds both blocks and adopts them.
  auto b = make_paged(*be_, pool);
  const int b0 = pool->lookup(hs[0]), b1 = pool->lookup(hs[1]);
  EXPECT_EQ(b0, a->blocks()[0]);
  EXPECT_EQ(b1, 1);
  ASSERT_TRUE(b->adopt({b0, b1}, 16).ok());
  pool->unref(b0);
  pool->unref(b1);
  std::vector<uint32_t> tb(ta.begin(), ta.begin() + 8);
  tb.insert(tb.end(), block1.begin(), block1.end());
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(pool_ok(*pool, {&a->blocks(), &b->blocks()}));
  a->release();
  b->release();
  const KvPoolCounts c = pool->counts();
  EXPECT_EQ(c.used, 0);
  EXPECT_EQ(c.cached, 2);  // the published blocks stay for the next lookup
  EXPECT_TRUE(pool_ok(*pool, {}));
}

TEST_P(PagedCache, AFailedBeginForWantOfBlocksKeepsNone) {
  const int B = 8;
  auto pool = make_pool(*be_, GetParam(), B, 4);
  ASSERT_TRUE(pool);
  auto a = make_paged(*be_, pool);
  auto b = make_paged(*be_, pool);
  auto c = make_paged(*be_, pool);
  const auto tables = [&] {
    return std::vector<const std::vector<int32_t>*>{&a->blocks(), &b->blocks(), &c->blocks()};
  };
  std::vector<uint32_t> ta = tag_run(1, 16), tb = tag_run(100, 3);
  ASSERT_TRUE(append(*be_, *a, ta).ok());
  ASSERT_TRUE(append(*be_, *b, tb).ok());
  ASSERT_EQ(pool->available(), 1);
  // 17 more positions want 3 blocks; one is left. Nothing is taken or recorded.
  Status s = append(*be_, *a, tag_run(50, 17));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("in use"), std::string::npos) << s.message();
  EXPECT_EQ(a->length(), 16);
  EXPECT_EQ(a->blocks().size(), 2u);
  for (int l = 0; l < kShape.n_layer; ++l) {
    EXPECT_EQ(a->n_slots(l), 16);
    EXPECT_EQ(a->held_ranges(l), (std::vector<KvRange>{{0, 16}}));
  }
  EXPECT_EQ(pool->available(), 1);
  EXPECT_TRUE(rows_are(*a, ta, rows_));
  EXPECT_TRUE(pool_ok(*pool, tables()));
  // 8 more fit.
  auto more = tag_run(60, 8);
  ASSERT_TRUE(append(*be_, *a, more).ok());
  ta.insert(ta.end(), more.begin(), more.end());
  ASSERT_EQ(pool->available(), 0);
  // c forks b's partial block: writing needs a copy, and there is no block for it.
  ASSERT_TRUE(c->adopt(b->blocks(), 3).ok());
  std::vector<uint32_t> tc = tb;
  s = append(*be_, *c, {7});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(c->length(), 3);
  EXPECT_EQ(c->blocks(), b->blocks());
  EXPECT_EQ(c->cow_copies(), 0);
  EXPECT_EQ(pool->ref_count(b->blocks()[0]), 2);
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(rows_are(*c, tc, rows_));
  EXPECT_TRUE(pool_ok(*pool, tables()));
  // Once a block is free the same write goes through.
  a->release();
  ASSERT_TRUE(append(*be_, *c, {7}).ok());
  tc.push_back(7);
  EXPECT_EQ(c->cow_copies(), 1);
  EXPECT_TRUE(rows_are(*b, tb, rows_));
  EXPECT_TRUE(rows_are(*c, tc, rows_));
  EXPECT_TRUE(pool_ok(*pool, tables()));
}

// Random operations on several paged caches over a small pool, against a host-side model
// of what every cache holds: the pool's invariants after every operation, and every
// cache's rows those written for it. A write fails exactly when the pool has fewer
// available blocks than it needs, and then changes nothing.
TEST_P(PagedCache, RandomOperationsKeepTheInvariantsAndTheRows) {
  const int B = 8, kBlocks = 16, kCaches = 5, kMaxLen = 80, kOps = 3000;
  auto pool = make_pool(*be_, GetParam(), B, kBlocks);
  ASSERT_TRUE(pool);
  struct Seq {
    std::unique_ptr<KvCache> cache;
    std::vector<uint32_t> tags;
  };
  std::vector<Seq> seqs(kCaches);
  std::map<uint64_t, std::vector<uint32_t>> published;  // hash -> the prefix it names
  std::mt19937 rng(20261125);
  const auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  uint32_t next_tag = 1;
  int n_fail = 0, n_cow = 0, n_hits = 0, n_evicted = 0;
  const auto tables = [&] {
    std::vector<const std::vector<int32_t>*> t;
    for (const Seq& s : seqs)
      if (s.cache) t.push_back(&s.cache->blocks());
    return t;
  };

  for (int op = 0; op < kOps; ++op) {
    Seq& s = seqs[size_t(pick(kCaches))];
    const int kind = pick(100);
    std::string what;
    if (!s.cache || kind < 3) {  // (re)create
      what = "create";
      s.cache = make_paged(*be_, pool);
      s.tags.clear();
      ASSERT_TRUE(s.cache);
    } else if (kind < 55) {  // append 1..3 or a longer prefill
      const int len = s.cache->length();
      int T = pick(3) == 0 ? 1 + pick(3 * B) : 1 + pick(3);
      T = std::min(T, kMaxLen - len);
      what = "append " + std::to_string(T);
      if (T <= 0) continue;
      const int last = len > 0 ? s.cache->blocks()[size_t((len - 1) / B)] : -1;
      const bool cow = len % B != 0 && (pool->ref_count(last) > 1 || pool->published(last));
      const int need = kv_blocks_for(len + T, B) - int(s.cache->blocks().size()) + int(cow);
      const int available = pool->available();
      const std::vector<int32_t> before = s.cache->blocks();
      const int copies = s.cache->cow_copies();
      const auto more = tag_run(next_tag, T);
      next_tag += uint32_t(T);
      Status st = append(*be_, *s.cache, more);
      ASSERT_EQ(st.ok(), need <= available)
          << "op " << op << ": " << what << " needing " << need << " blocks of " << available
          << ": " << st.message();
      if (st.ok()) {
        s.tags.insert(s.tags.end(), more.begin(), more.end());
        ASSERT_EQ(s.cache->cow_copies(), copies + int(cow));
        n_cow += int(cow);
      } else {
        ++n_fail;
        ASSERT_EQ(s.cache->blocks(), before) << "op " << op << ": a failed write kept blocks";
        ASSERT_EQ(pool->available(), available) << "op " << op;
      }
    } else if (kind < 63) {  // fork: adopt a prefix of another cache
      Seq& src = seqs[size_t(pick(kCaches))];
      if (&src == &s || !src.cache || src.cache->length() == 0) continue;
      const int n = pick(src.cache->length() + 1);
      what = "fork " + std::to_string(n);
      const std::vector<int32_t> prefix(src.cache->blocks().begin(),
                                        src.cache->blocks().begin() + kv_blocks_for(n, B));
      if (s.cache->length() > 0) {
        const std::vector<int32_t> before = s.cache->blocks();
        ASSERT_FALSE(s.cache->adopt(prefix, n).ok());
        ASSERT_EQ(s.cache->blocks(), before);
        s.cache->release();
        s.tags.clear();
        ASSERT_TRUE(pool_ok(*pool, tables())) << "op " << op << " after release";
      }
      ASSERT_TRUE(s.cache->adopt(prefix, n).ok()) << "op " << op;
      s.tags.assign(src.tags.begin(), src.tags.begin() + n);
    } else if (kind < 71) {  // truncate: a few positions, or anywhere
      const int len = s.cache->length();
      const int n = pick(2) == 0 ? std::max(0, len - 1 - pick(B)) : pick(len + 1);
      what = "truncate " + std::to_string(n);
      ASSERT_TRUE(s.cache->truncate(n).ok());
      s.tags.resize(size_t(n));
    } else if (kind < 74) {  // release (or drop the cache)
      what = "release";
      if (pick(2) == 0) {
        s.cache->release();
      } else {
        s.cache.reset();
      }
      s.tags.clear();
    } else if (kind < 88) {  // publish a full block under its chained hash
      const int full = s.cache->length() / B;
      if (full == 0) continue;
      const int i = pick(full);
      what = "publish block " + std::to_string(i);
      const auto hs = chain(*pool, s.tags);
      pool->publish(s.cache->blocks()[size_t(i)], hs[size_t(i)]);
      published[hs[size_t(i)]].assign(s.tags.begin(), s.tags.begin() + (i + 1) * B);
    } else {  // a prompt that starts with a published prefix: lookup, then adopt
      if (published.empty()) continue;
      auto it = published.begin();
      std::advance(it, pick(int(published.size())));
      const std::vector<uint32_t> prompt = it->second;
      what = "lookup " + std::to_string(prompt.size());
      const auto hs = chain(*pool, prompt);
      std::vector<int32_t> found;
      for (uint64_t h : hs) {
        const int b = pool->lookup(h);
        if (b < 0) break;
        found.push_back(b);
      }
      // Every block found holds the rows its hash names.
      for (size_t j = 0; j < found.size(); ++j)
        ASSERT_TRUE(block_is(*pool, found[j],
                             std::vector<uint32_t>(prompt.begin() + int(j) * B,
                                                   prompt.begin() + int(j + 1) * B),
                             rows_))
            << "op " << op;
      n_hits += int(found.size());
      n_evicted += int(found.size() < hs.size());
      s.cache->release();
      ASSERT_TRUE(s.cache->adopt(found, int(found.size()) * B).ok());
      for (int32_t b : found) pool->unref(b);  // the lookups' references
      s.tags.assign(prompt.begin(), prompt.begin() + int(found.size()) * B);
    }
    SCOPED_TRACE("op " + std::to_string(op) + ": " + what);
    ASSERT_TRUE(pool_ok(*pool, tables()));
    for (size_t j = 0; j < seqs.size(); ++j) {
      if (!seqs[j].cache) continue;
      ASSERT_EQ(int(seqs[j].cache->blocks().size()), kv_blocks_for(seqs[j].cache->length(), B))
          << "cache " << j;
      ASSERT_TRUE(rows_are(*seqs[j].cache, seqs[j].tags, rows_)) << "cache " << j;
    }
  }
  // The run went through the interesting cases.
  EXPECT_GT(n_fail, 20);
  EXPECT_GT(n_cow, 20);
  EXPECT_GT(n_hits, 20);
  EXPECT_GT(n_evicted, 5);
  for (Seq& s : seqs) s.cache.reset();
  EXPECT_TRUE(pool_ok(*pool, {}));
  EXPECT_EQ(pool->counts().used, 0);
}

INSTANTIATE_TEST_SUITE_P(Types, PagedCache, ::testing::Values(kF16, kQ8),
                         [](const ::testing::TestParamInfo<KvTypes>& i) {
                           return i.param.k == KvDtype::F16 ? std::string("f16")
                                                            : std::string("q8_0");
                         });

// A paged cache that counts the backend refreshes (paged_changed) it asks for.
class CountingPagedCache final : public KvCache {
 public:
  CountingPagedCache(KvCacheConfig c, std::shared_ptr<KvPool> pool)
      : KvCache(std::move(c), std::move(pool)) {}
  Status init() { return init_storage(0); }
  int refreshes = 0;
  PagedChange last = PagedChange::Any;

 protected:
  Status relayout(int, int, const std::vector<int32_t>&) override { return Status::Ok(); }
  Status paged_changed(PagedChange change) override {
    ++refreshes;
    last = change;
    return Status::Ok();
  }
};

// begin() across a block boundary grows every layer but refreshes the backend's copy of
// the tables and slot maps once (a GPU uploads them all on each refresh: per layer, a
// crossing of a 30-layer model made 30 refreshes of 31 copies each); within a block, none.
// A crossing tells the backend that only the tables grew (then a GPU uploads them alone),
// except the first, and except after anything else changed: then the backend's copy may
// differ anywhere.
TEST(KvPool, BeginAcrossABlockRefreshesTheBackendOnce) {
  using Change = KvCache::PagedChange;
  auto be = make_cpu_backend(1);
  const KvShape shape{6, 2, 64};
  auto pool = make_pool(*be, kF16, 8, 16, shape);
  ASSERT_TRUE(pool);
  CountingPagedCache cache(kv_config_full(shape, kF16), pool);
  ASSERT_TRUE(cache.init().ok());
  for (int pos = 0; pos < 20; ++pos) {
    const int before = cache.refreshes;
    ASSERT_TRUE(cache.begin(pos, 1).ok());
    EXPECT_EQ(cache.refreshes - before, pos % 8 == 0 ? 1 : 0) << "position " << pos;
    if (pos % 8 == 0) {
      EXPECT_EQ(cache.last, pos == 0 ? Change::Any : Change::Grown) << "position " << pos;
    }
    for (int l = 0; l < shape.n_layer; ++l) {
      EXPECT_EQ(cache.slot_of(l, pos), pos);
      EXPECT_EQ(cache.slot_pos(l)[size_t(pos)], pos);
    }
    ASSERT_TRUE(cache.end().ok());
  }
  EXPECT_EQ(cache.blocks().size(), 3u);
  // After a truncation (or a release) the next crossing refreshes everything.
  ASSERT_TRUE(cache.truncate(10).ok());
  EXPECT_EQ(cache.last, Change::Any);
  for (int pos = 10; pos <= 16; ++pos) {
    ASSERT_TRUE(cache.begin(pos, 1).ok());
    ASSERT_TRUE(cache.end().ok());
  }
  EXPECT_EQ(cache.last, Change::Grown);
  cache.release();
  ASSERT_TRUE(cache.begin(0, 1).ok());
  EXPECT_EQ(cache.last, Change::Any);
  ASSERT_TRUE(cache.end().ok());
  // A crossing the pool cannot serve fails, forgets the position and gives back what it took.
  auto small = make_pool(*be, kF16, 8, 1, shape);
  CountingPagedCache full(kv_config_full(shape, kF16), small);
  ASSERT_TRUE(full.init().ok());
  ASSERT_TRUE(full.begin(0, 8).ok());
  ASSERT_TRUE(full.end().ok());
  EXPECT_FALSE(full.begin(8, 1).ok());
  EXPECT_EQ(full.length(), 8);
  EXPECT_EQ(full.blocks().size(), 1u);
  EXPECT_EQ(small->available(), 0);
}

}  // namespace
}  // namespace kvscope
