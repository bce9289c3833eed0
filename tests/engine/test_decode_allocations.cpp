// test_decode_allocations.cpp — a steady decode step allocates nothing. This program
// replaces the global operator new (every form) and interposes aligned_alloc, and counts
// each call made from any thread while a stretch of decode steps runs on the CPU backend
// (2 threads), after the steps before it have warmed every buffer up:
//   - forward() on the default model, one token a step, over a contiguous cache whose
//     capacity is already there, and over a paged cache within one block, as the app's
//     session runs it (attention rows and K/V row norms asked), with f16 K/V and with
//     q8_0 K/V and the quantization errors measured (the error colouring);
//   - forward_batch() of four sequences' decode rows over one pool (the rows ops' path and
//     the shared LM-head product), within a block;
//   - forward() on Gemma 3's windowed layers, whose ring (contiguous) and whose blocks
//     (paged: the ones wholly outside the window go back to the pool) stay at their size;
//   - a session's step (Session::step, what the app runs), greedy and sampled: less than
//     one vocabulary row of floats in all, the step's own record (attention rows, held
//     ranges, texts) included.
// Buffers that grow with the sequence (the attention rows, attention's key lists, the
// RoPE table) grow in steps of many positions (or to the cache's slots), so they grow
// when the cache does, not at every step.
// A step that crosses into a new block takes that block and grows the block tables and
// slot maps: such steps are outside the counted stretches, and are counted on their own
// only to show the counter sees the engine's allocations.
// Each stretch is counted step by step: at most kFirstUseSteps of its steps may allocate
// (a pool thread's own buffers, the first time it gets such a job; see there).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "tests/util/model_fixture.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<long> g_calls{0};
std::atomic<long> g_bytes{0};

// Where a debugger's breakpoint shows who allocated (`break kvscope_counted_allocation`).
extern "C" [[gnu::noinline]] void kvscope_counted_allocation(std::size_t n) {
  asm volatile("" : : "r"(n) : "memory");
}

void note(std::size_t n) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  kvscope_counted_allocation(n);
  g_calls.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(long(n), std::memory_order_relaxed);
}

void* plain(std::size_t n) {
  note(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* aligned(std::size_t n, std::align_val_t a) {
  note(n);
  const std::size_t al = std::max(std::size_t(a), sizeof(void*));
  void* p = nullptr;
  if (posix_memalign(&p, al, n ? n : 1) == 0) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t n) { return plain(n); }
void* operator new[](std::size_t n) { return plain(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  note(n);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  note(n);
  return std::malloc(n ? n : 1);
}
void* operator new(std::size_t n, std::align_val_t a) { return aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

// The C allocation the CPU backend's K/V storage and packed weights use, counted and passed
// on to the C library's (or the sanitizer's) own.
extern "C" void* aligned_alloc(std::size_t alignment, std::size_t n) {
  using Fn = void* (*)(std::size_t, std::size_t);
  static Fn next = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "aligned_alloc"));
  note(n);
  return next ? next(alignment, n) : nullptr;
}

namespace kvscope {
namespace {

constexpr KvTypes kF16{KvDtype::F16, KvDtype::F16};
constexpr KvTypes kQ8{KvDtype::Q8_0, KvDtype::Q8_0};
constexpr int kBlock = 16;

struct Count {
  long calls = 0, bytes = 0;
  int steps = 0;  // with counted_steps: how many of the steps allocated at all
};

// A pool thread's own buffers (engine/cpu: each thread's unpacked x, its attention chunks)
// grow the first time the pool hands that thread such a job; under load (ctest -j) that
// can first happen in any step. So a stretch may hold at most this many steps that
// allocate, while an allocation made per step shows in every one of them.
constexpr int kFirstUseSteps = 2;

// What `run` allocates, from every thread.
template <class F>
Count counted(F&& run) {
  g_calls = 0;
  g_bytes = 0;
  g_counting = true;
  run();
  g_counting = false;
  return Count{g_calls.load(), g_bytes.load()};
}

// counted() of each of n calls of step(i), summed.
template <class F>
Count counted_steps(int n, F&& step) {
  Count all;
  for (int i = 0; i < n; ++i) {
    const Count c = counted([&] { step(i); });
    all.calls += c.calls;
    all.bytes += c.bytes;
    all.steps += c.calls > 0 ? 1 : 0;
  }
  return all;
}

std::vector<int32_t> text_tokens(const Model& m, int n) {
  auto ids = tokenize_prompt(
      m, PromptSpec{"The old lighthouse keeper climbed the stairs and looked out over the grey "
                    "sea, where the fishing boats were coming home before the storm. He lit "
                    "the lamp, wound the clock and wrote the time in the logbook, as his "
                    "father had done for forty years before him, and his grandfather before "
                    "that, in the days when the light was a fire of driftwood and whale oil.",
                    false, false});
  EXPECT_TRUE(ids.ok());
  std::vector<int32_t> t = ids.ok() ? *ids : std::vector<int32_t>{};
  while (!t.empty() && int(t.size()) < n) t.insert(t.end(), t.begin(), t.end());
  t.resize(size_t(n));
  return t;
}

// One sequence, as the session runs it: a prompt of `prompt` tokens, then one-token steps;
// the steps at positions [quiet0, quiet1) are counted. Returns what they allocated, and in
// *first the step at `prompt` (the first decode step, which sizes the buffers).
struct Solo {
  Count quiet, first;
  bool ran = false;
};
Solo run_solo(const Model& m, Backend& be, KvCache& cache, bool errors, int prompt, int quiet0,
              int quiet1) {
  Solo r;
  const std::vector<int32_t> toks = text_tokens(m, quiet1 + 1);
  ForwardOutput out;
  out.want_kv_errors = errors;
  Status st = forward(be, m, toks.data(), prompt, 0, cache, out);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return r;
  r.first = counted([&] { st = forward(be, m, &toks[size_t(prompt)], 1, prompt, cache, out); });
  EXPECT_TRUE(st.ok()) << st.message();
  for (int p = prompt + 1; p < quiet0 && st.ok(); ++p)
    st = forward(be, m, &toks[size_t(p)], 1, p, cache, out);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return r;
  const size_t logits = out.logits.size();
  r.quiet = counted_steps(quiet1 - quiet0, [&](int i) {
    if (st.ok()) st = forward(be, m, &toks[size_t(quiet0 + i)], 1, quiet0 + i, cache, out);
  });
  EXPECT_TRUE(st.ok()) << st.message();
  // The counted steps did the work: logits, attention over every position, rows normed.
  const int L = cache.shape().n_layer;
  EXPECT_EQ(logits, size_t(m.config().n_vocab));
  EXPECT_EQ(out.logits.size(), logits);
  EXPECT_EQ(out.attention.size(), size_t(L) * size_t(m.config().n_head) * size_t(quiet1));
  EXPECT_EQ(out.k_norm.size(), size_t(L));
  EXPECT_GT(out.k_norm[0], 0.0f);
  EXPECT_EQ(out.k_err.size(), errors ? size_t(L) : 0u);
  if (errors) {
    EXPECT_GT(out.k_err[0], 0.0f);  // q8_0 rows differ from their f32 values
  }
  EXPECT_EQ(cache.length(), quiet1);
  r.ran = st.ok();
  return r;
}

std::shared_ptr<KvPool> make_pool(Backend& be, const KvCacheConfig& cfg, KvTypes types,
                                  int seqs, int positions) {
  const KvLayerGroups groups = kv_layer_groups(cfg);
  KvPoolConfig pc{{groups.size, cfg.shape.n_head_kv, cfg.shape.head_dim}, types, kBlock,
                  groups.count() * seqs * kv_blocks_for(positions, kBlock)};
  auto pool = be.create_kv_pool(pc);
  EXPECT_TRUE(pool.ok()) << (pool.ok() ? "" : pool.error().message);
  return pool.ok() ? *pool : nullptr;
}

using DecodeAllocations = ModelTest<DefaultModelFile>;

TEST_F(DecodeAllocations, ADecodeStepOnAContiguousCacheAllocatesNothing) {
  auto be = make_cpu_backend(2);
  for (const KvTypes types : {kF16, kQ8}) {
    const bool errors = types.k == KvDtype::Q8_0;
    SCOPED_TRACE(errors ? "q8_0, errors measured" : "f16");
    auto cache = be->create_kv_cache(kv_cache_config(*model_, types, KvPolicy::ModelWindow), 64);
    ASSERT_TRUE(cache.ok()) << cache.error().message;
    const Solo r = run_solo(*model_, *be, **cache, errors, 20, 24, 56);
    ASSERT_TRUE(r.ran);
    EXPECT_LE(r.quiet.steps, kFirstUseSteps) << r.quiet.calls << " allocations, " << r.quiet.bytes
                                             << " bytes in 32 steps";
  }
}

TEST_F(DecodeAllocations, ADecodeStepWithinABlockOfThePoolAllocatesNothing) {
  auto be = make_cpu_backend(2);
  for (const KvTypes types : {kF16, kQ8}) {
    const bool errors = types.k == KvDtype::Q8_0;
    SCOPED_TRACE(errors ? "q8_0, errors measured" : "f16");
    const KvCacheConfig cfg = kv_cache_config(*model_, types, KvPolicy::ModelWindow);
    auto pool = make_pool(*be, cfg, types, 1, 64);
    ASSERT_TRUE(pool);
    auto cache = be->create_paged_kv_cache(cfg, pool);
    ASSERT_TRUE(cache.ok()) << cache.error().message;
    // Prompt 0..31 (blocks 0, 1); the first step, at 32, opens block 2; 33..47 stay in it.
    const Solo r = run_solo(*model_, *be, **cache, errors, 32, 33, 48);
    ASSERT_TRUE(r.ran);
    EXPECT_LE(r.quiet.steps, kFirstUseSteps) << r.quiet.calls << " allocations, " << r.quiet.bytes
                                             << " bytes in 15 steps";
    // The step that took a new block and grew the tables is seen by the counter.
    EXPECT_GT(r.first.calls, 0);
  }
}

TEST_F(DecodeAllocations, ABatchedDecodeStepWithinABlockAllocatesNothing) {
  auto be = make_cpu_backend(2);
  constexpr int kSeqs = 4, kPrompt = 32;
  const KvCacheConfig cfg = kv_cache_config(*model_, kF16, KvPolicy::Full);
  auto pool = make_pool(*be, cfg, kF16, kSeqs, 64);
  ASSERT_TRUE(pool);
  const std::vector<int32_t> toks = text_tokens(*model_, 64 + kSeqs);
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<BatchSeq> seqs;
  std::vector<BatchSeqOutput> res;
  for (int i = 0; i < kSeqs; ++i) {
    auto c = be->create_paged_kv_cache(cfg, pool);
    ASSERT_TRUE(c.ok()) << c.error().message;
    caches.push_back(std::move(*c));
    seqs = {BatchSeq{caches.back().get(), &toks[size_t(i)], kPrompt}};
    ASSERT_TRUE(forward_batch(*be, *model_, seqs, res).ok());
  }
  Status st = Status::Ok();
  const auto step = [&] {
    seqs.clear();
    for (int i = 0; i < kSeqs; ++i) {
      KvCache& c = *caches[size_t(i)];
      seqs.push_back(BatchSeq{&c, &toks[size_t(i + c.length())], 1});
    }
    if (st.ok()) st = forward_batch(*be, *model_, seqs, res);
  };
  step();  // position 32: each sequence opens block 2
  step();
  ASSERT_TRUE(st.ok()) << st.message();
  const Count quiet = counted_steps(14, [&](int) { step(); });  // positions 34 .. 47
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_LE(quiet.steps, kFirstUseSteps) << quiet.calls << " allocations, " << quiet.bytes
                                         << " bytes in 14 steps of " << kSeqs << " sequences";
  ASSERT_EQ(res.size(), size_t(kSeqs));
  for (int i = 0; i < kSeqs; ++i) {
    EXPECT_EQ(res[size_t(i)].logits.size(), size_t(model_->config().n_vocab));
    EXPECT_EQ(caches[size_t(i)]->length(), 48);
  }
}

// A session step returns its record (the attention rows, each layer's held ranges, the
// texts), which the app keeps: those allocations are the record's own. What it must not do
// is allocate a vocabulary's worth of floats at every step (the logits, the softmax, the
// sampler's sort), greedy or sampled: the whole step's allocations stay below one row.
TEST_F(DecodeAllocations, ASessionStepAllocatesLessThanOneVocabularyRow) {
  const size_t row = size_t(model_->config().n_vocab) * sizeof(float);
  for (const float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    auto s = session(config(CacheMode::Cache, 80));
    ASSERT_TRUE(s);
    SamplerConfig sc;
    sc.temperature = temperature;
    s->set_sampler(sc);
    ASSERT_TRUE(s->reset(PromptSpec{"The old lighthouse keeper climbed the stairs and", false,
                                    false})
                    .ok());
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(s->step().ok());
    for (int i = 0; i < 12; ++i) {
      Expected<StepTrace> t = Error{"not run"};
      const Count c = counted([&] { t = s->step(); });
      ASSERT_TRUE(t.ok()) << t.error().message;
      EXPECT_GT(t->n_attn, 0);  // the record holds the attention rows
      EXPECT_LT(size_t(c.bytes), row) << c.calls << " allocations at step " << t->step;
    }
  }
}

using DecodeAllocationsGemma = ModelTest<GemmaModelFile>;

TEST_F(DecodeAllocationsGemma, ADecodeStepOnTheWindowedLayersAllocatesNothing) {
  auto be = make_cpu_backend(2);
  const KvCacheConfig cfg = kv_cache_config(*model_, kF16, KvPolicy::ModelWindow);
  // Gemma 3 270M's local layers see the last 512 positions: a prompt longer than that
  // fills their ring, which then keeps its size.
  const int window = cfg.layers[0].window > 0 ? cfg.layers[0].window : cfg.layers[1].window;
  ASSERT_GT(window, 0);
  const int prompt = window + 40;
  {
    SCOPED_TRACE("contiguous");
    auto cache = be->create_kv_cache(cfg, prompt + 64);
    ASSERT_TRUE(cache.ok()) << cache.error().message;
    const Solo r = run_solo(*model_, *be, **cache, false, prompt, prompt + 8, prompt + 24);
    ASSERT_TRUE(r.ran);
    EXPECT_LE(r.quiet.steps, kFirstUseSteps) << r.quiet.calls << " allocations in 16 steps";
  }
  {
    SCOPED_TRACE("paged");
    auto pool = make_pool(*be, cfg, kF16, 1, prompt + 64);
    ASSERT_TRUE(pool);
    auto cache = be->create_paged_kv_cache(cfg, pool);
    ASSERT_TRUE(cache.ok()) << cache.error().message;
    // Positions prompt .. are inside one block: (window + 40) is 8 past a block start.
    const int b0 = (prompt / kBlock + 1) * kBlock;
    const Solo r = run_solo(*model_, *be, **cache, false, b0 - 2, b0 + 1, b0 + kBlock - 1);
    ASSERT_TRUE(r.ran);
    EXPECT_LE(r.quiet.steps, kFirstUseSteps) << r.quiet.calls << " allocations in "
                                             << kBlock - 2 << " steps";
  }
}

}  // namespace
}  // namespace kvscope
