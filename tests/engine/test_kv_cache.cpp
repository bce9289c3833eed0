// test_kv_cache.cpp — the KV cache's slot -> position map on the CPU backend: a windowed
// layer keeps exactly the positions its window can see (a ring that widens for a batch
// and trims back), a full layer keeps everything, the rows survive every relayout, the
// bytes reported are the rows held; and on a tiny model a windowed CACHE run gives
// bit-identical logits and attention rows to NO CACHE with the same mask.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "tests/util/kv_positions.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

constexpr int kHkv = 2, kD = 8;

// A two-layer cache: layer 0 holds everything, layer 1 has window = keep = 8.
KvCacheConfig two_layer_config(KvTypes types) {
  KvCacheConfig cfg = kv_config_full({2, kHkv, kD}, types);
  cfg.layers[1] = KvLayerRule{8, 0, 8};
  return cfg;
}

using test::write_positions;

// Every held position's rows still carry their values.
void expect_rows_intact(Backend& be, const KvCache& cache, int layer) {
  auto kn = be.scratch(2, 1, 1);
  auto vn = be.scratch(3, 1, 1);
  ASSERT_TRUE(kn.ok() && vn.ok());
  const float per = std::sqrt(float(kHkv * kD));
  for (const KvRange& r : cache.held_ranges(layer))
    for (int p = r.begin; p < r.end; ++p) {
      ASSERT_TRUE(be.kv_row_norms(cache, layer, p, 1, *kn, *vn).ok());
      EXPECT_NEAR(kn->data[0], float(p + 1) * per, 1e-3f * float(p + 1))
          << "layer " << layer << " pos " << p;
      EXPECT_NEAR(vn->data[0], float(p + 1) * per, 1e-3f * float(p + 1));
    }
}

TEST(KvCache, WindowedLayerKeepsTheLastWindowFullLayerKeepsAll) {
  auto be = make_cpu_backend(1);
  for (KvTypes types : {KvTypes{KvDtype::F16, KvDtype::F16}, KvTypes{KvDtype::F32, KvDtype::F16}}) {
    SCOPED_TRACE(kv_types_name(types));
    auto made = be->create_kv_cache(two_layer_config(types), 4);
    ASSERT_TRUE(made.ok()) << made.error().message;
    KvCache& c = **made;
    const uint64_t pos_bytes = kHkv * (kv_row_bytes(types.k, kD) + kv_row_bytes(types.v, kD));
    EXPECT_EQ(pos_bytes, kv_position_bytes(c.shape(), types));
    // A 5-token prompt, then a 10-token batch (wider than the 8-slot ring), then decode.
    std::vector<int> steps = {5, 10};
    for (int i = 0; i < 20; ++i) steps.push_back(1);
    int n = 0;
    for (int T : steps) {
      write_positions(*be, c, n, T);
      n += T;
      ASSERT_EQ(c.length(), n);
      EXPECT_EQ(c.held_ranges(0), (std::vector<KvRange>{{0, n}}));
      EXPECT_EQ(c.held_ranges(1), (std::vector<KvRange>{{std::max(0, n - 8), n}}));
      EXPECT_LE(c.n_slots(1), 8) << "the ring is trimmed back after a batch";
      EXPECT_GE(c.n_slots(0), n);
      EXPECT_EQ(c.layer_bytes(0), uint64_t(n) * pos_bytes);
      EXPECT_EQ(c.layer_bytes(1), uint64_t(std::min(n, 8)) * pos_bytes);
      EXPECT_EQ(c.bytes_used(), c.layer_bytes(0) + c.layer_bytes(1));
      expect_rows_intact(*be, c, 0);
      expect_rows_intact(*be, c, 1);
    }
    // Past the window the ring's slots hold positions out of order (slot = p % 8), and
    // slots_by_position lists them oldest first.
    std::vector<int32_t> order = {7, 7, 7};  // replaced, not appended to
    c.slots_by_position(1, order);
    ASSERT_EQ(order.size(), 8u);
    for (size_t i = 0; i < order.size(); ++i)
      EXPECT_EQ(c.slot_pos(1)[size_t(order[i])], n - 8 + int(i));
    EXPECT_EQ(c.slot_of(1, n), n % 8);
  }
}

TEST(KvCache, WritesMustContinueTheSequenceAndRulesMustHoldTheWindow) {
  auto be = make_cpu_backend(1);
  auto made = be->create_kv_cache(two_layer_config({}), 4);
  ASSERT_TRUE(made.ok());
  Status gap = (*made)->begin(3, 1);
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.message().find("position 3"), std::string::npos) << gap.message();
  // A ring smaller than its window would drop keys the mask says are visible.
  KvCacheConfig bad = two_layer_config({});
  bad.layers[1] = KvLayerRule{8, 0, 4};
  auto refused = be->create_kv_cache(bad, 4);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("keep must be at least the window"), std::string::npos)
      << refused.error().message;
}

// A tiny llama with a window of 6 on layer 0 (layer 1 global): CACHE (prefill of 9, then
// one token at a time through a 6-slot ring) and NO CACHE (the whole sequence each step,
// the same mask on a scratch cache) give bit-identical logits and attention rows, and the
// attention of layer 0 is 0 outside the window.
TEST(KvCache, WindowedCacheEqualsNoCacheBitForBit) {
  test::TinyModelSpec spec;
  spec.seed = 5;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvscope_kv_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  ASSERT_TRUE(test::write_tiny_llama(spec, path).ok());
  auto m = Model::load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Model& model = **m;
  const ModelConfig& c = model.config();
  const int W = 6;
  KvCacheConfig cfg = kv_config_full({c.n_layer, c.n_head_kv, c.head_dim}, {});
  cfg.layers[0] = KvLayerRule{W, 0, W};
  auto be = make_cpu_backend(2);
  auto cache = be->create_kv_cache(cfg, 4);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> seq = {1, 40, 41, 72, 100, 101, 102, 33, 3};
  ForwardOutput a;
  ASSERT_TRUE(forward(*be, model, seq.data(), int(seq.size()), 0, **cache, a).ok());
  for (int step = 0; step < 16; ++step) {
    if (step > 0) {
      ASSERT_TRUE(forward(*be, model, &seq.back(), 1, int(seq.size()) - 1, **cache, a).ok());
    }
    auto scratch = be->create_kv_cache(kv_config_scratch(cfg), int(seq.size()));
    ASSERT_TRUE(scratch.ok());
    ForwardOutput b;
    ASSERT_TRUE(forward(*be, model, seq.data(), int(seq.size()), 0, **scratch, b).ok());
    const int n = int(seq.size());
    EXPECT_EQ(a.logits, b.logits) << "step " << step;
    EXPECT_EQ(a.attention, b.attention) << "step " << step;
    ASSERT_EQ(a.attention.size(), size_t(c.n_layer) * c.n_head * n);
    for (int h = 0; h < c.n_head; ++h) {
      double sum = 0;
      for (int j = 0; j < n; ++j) {
        const float p = a.attention[size_t(h) * n + j];  // layer 0
        if (n - 1 - j >= W) {
          EXPECT_EQ(p, 0.0f) << "position " << j << " is outside the window";
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
    EXPECT_EQ((*cache)->held(0), std::min(n, W));
    EXPECT_EQ((*cache)->held(1), n);
    EXPECT_EQ((*scratch)->held(0), n) << "NO CACHE's scratch holds what it computed";
    // FLOPs count the keys each query sees: decode reads min(n, W) keys on layer 0.
    if (step > 0) {
      const uint64_t attn = 2ull * 2 * c.head_dim * c.n_head * (uint64_t(std::min(n, W)) + n);
      const uint64_t mats = model.block_macs_per_token() + uint64_t(c.n_embd) * c.n_vocab;
      EXPECT_EQ(a.flops, 2 * mats + attn);
    }
    seq.push_back(int32_t(std::max_element(a.logits.begin(), a.logits.end()) - a.logits.begin()));
  }
}

}  // namespace
}  // namespace kvscope
