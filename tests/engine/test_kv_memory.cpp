// test_kv_memory.cpp — the KV memory formula against hand-worked numbers: the textbook's
// reference shapes (512 KiB per token for a 32-layer 4096-wide model in fp16, 320 KiB for
// a 70B model with 8 KV heads of 128), the default model per cache type with block
// overhead, K and V types apart, windows, Gemma-style local layers, GQA against one KV
// head per query head; and that a real cache's bytes equal the formula.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/cpu/cpu_backend.h"
#include "engine/kv_memory.h"
#include "engine/kv_policy.h"
#include "engine/session.h"

namespace kvscope {
namespace {

KvMemoryOptions types(KvDtype k, KvDtype v) {
  KvMemoryOptions o;
  o.types = {k, v};
  return o;
}

TEST(KvMemory, TypeNamesSizesAndParsing) {
  for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0}) {
    KvDtype p = KvDtype::F32;
    ASSERT_TRUE(kv_dtype_parse(kv_dtype_name(t), &p));
    EXPECT_EQ(p, t);
  }
  KvDtype p;
  EXPECT_FALSE(kv_dtype_parse("q5_0", &p));
  EXPECT_FALSE(kv_dtype_parse("F16", &p));
  EXPECT_FALSE(kv_dtype_parse("", &p));
  // One head row of 64 values: 256 B f32, 128 B f16, 2 blocks x 34 B, 2 blocks x 18 B.
  EXPECT_EQ(kv_row_bytes(KvDtype::F32, 64), 256u);
  EXPECT_EQ(kv_row_bytes(KvDtype::F16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(KvDtype::Q8_0, 64), 68u);
  EXPECT_EQ(kv_row_bytes(KvDtype::Q4_0, 64), 36u);
  // q8_0: 34 bytes per 32 values; a head dim that is not a multiple of 32 does not fit.
  EXPECT_EQ(kv_row_bytes(KvDtype::Q8_0, 32), 34u);
  EXPECT_EQ(kv_row_bytes(KvDtype::Q8_0, 48), 0u);
  EXPECT_EQ(kv_row_bytes(KvDtype::F16, 48), 96u);
}

TEST(KvMemory, SeedReferenceShapes) {
  const auto refs = kv_reference_shapes();
  ASSERT_EQ(refs.size(), 3u);
  const KvMemoryOptions f16;
  // 2 x 32 layers x 4096 wide x 2 bytes = 524,288 B = 512 KiB per token.
  EXPECT_EQ(kv_bytes_per_token(refs[0], f16), 524288u);
  // 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 B = 320 KiB per token;
  // at 4096 tokens 1,342,177,280 B (1.25 GiB, the seed's "1.34 GB").
  EXPECT_EQ(kv_bytes_per_token(refs[1], f16), 327680u);
  EXPECT_EQ(kv_bytes(refs[1], f16, 4096), 1342177280ull);
  // Without GQA (one KV head per query head) the 70B model would hold 8x as much.
  KvMemoryOptions mha;
  mha.one_kv_head_per_query_head = true;
  EXPECT_EQ(kv_bytes_per_token(refs[1], mha), 2621440u);
  EXPECT_EQ(kv_bytes_per_token(refs[0], mha), 524288u);  // already one per query head
  // GPT-2 small: 2 x 12 x 768 x 2 = 36,864 B per token; 8K tokens = 288 MiB.
  EXPECT_EQ(kv_bytes_per_token(refs[2], f16), 36864u);
  EXPECT_EQ(kv_bytes(refs[2], f16, 8192), 301989888ull);
  // fp32 doubles everything.
  EXPECT_EQ(kv_bytes_per_token(refs[0], types(KvDtype::F32, KvDtype::F32)), 1048576u);
}

TEST(KvMemory, DefaultModelShapePerCacheType) {
  // SmolLM2-135M: 30 layers, 9 query heads, 3 KV heads of 64 (numbers by hand).
  const KvMemoryShape s{"SmolLM2-135M", 30, 9, 3, 64, {}};
  EXPECT_EQ(kv_bytes_per_token(s, types(KvDtype::F16, KvDtype::F16)), 23040u);  // 30*2*3*64*2
  EXPECT_EQ(kv_bytes_per_token(s, types(KvDtype::F32, KvDtype::F32)), 46080u);
  EXPECT_EQ(kv_bytes_per_token(s, types(KvDtype::Q8_0, KvDtype::Q8_0)), 12240u);  // 30*2*3*68
  EXPECT_EQ(kv_bytes_per_token(s, types(KvDtype::Q4_0, KvDtype::Q4_0)), 6480u);   // 30*2*3*36
  EXPECT_EQ(kv_bytes_per_token(s, types(KvDtype::Q8_0, KvDtype::Q4_0)), 9360u);   // 30*3*(68+36)
  EXPECT_EQ(kv_bytes_per_token(s, types(KvDtype::F16, KvDtype::Q8_0)), 17640u);   // 30*3*(128+68)
  KvMemoryOptions mha;
  mha.one_kv_head_per_query_head = true;
  EXPECT_EQ(kv_bytes_per_token(s, mha), 69120u);  // 3x: 9 query heads share 3 KV heads
  // Sink 4 + window 256: the cache stops growing at 260 positions.
  KvMemoryOptions win;
  win.sink = 4;
  win.window = 256;
  EXPECT_EQ(kv_bytes(s, win, 100), 100u * 23040u);
  EXPECT_EQ(kv_bytes(s, win, 1000), 260u * 23040u);
  EXPECT_EQ(kv_positions_held(s, win, 0, 1000), 260);
  // In blocks of 16 (a paged cache): 100 positions take 7 blocks; with sink 4 + window
  // 256 at 1000 tokens the next query sees 745.., so blocks 46..62 and the sinks' block 0.
  KvMemoryOptions paged;
  paged.block = 16;
  EXPECT_EQ(kv_bytes(s, paged, 100), 112u * 23040u);
  EXPECT_EQ(kv_bytes(s, paged, 96), 96u * 23040u);
  win.block = 16;
  EXPECT_EQ(kv_bytes(s, win, 1000), 18u * 16u * 23040u);
  EXPECT_EQ(kv_bytes(s, win, 100), 112u * 23040u);
}

TEST(KvMemory, LocalLayersCapTheirPositions) {
  // Gemma 3 270M: 18 layers, 4 query heads, 1 KV head of 256; layers 5, 11, 17 global,
  // the other 15 keep the last 512 positions.
  KvMemoryShape g{"Gemma 3 270M", 18, 4, 1, 256, {}};
  for (int l = 0; l < 18; ++l) g.layer_window.push_back(l % 6 == 5 ? 0 : 512);
  const KvMemoryOptions f16;
  EXPECT_EQ(kv_bytes_per_token(g, f16), 18432u);  // 18*2*256*2
  EXPECT_EQ(kv_bytes(g, f16, 300), 300u * 18432u);
  // At 4096 tokens: 3 x 4096 x 1024 + 15 x 512 x 1024.
  EXPECT_EQ(kv_bytes(g, f16, 4096), 3ull * 4096 * 1024 + 15ull * 512 * 1024);
  EXPECT_EQ(kv_bytes_per_token(g, types(KvDtype::Q8_0, KvDtype::Q8_0)), 9792u);  // 18*2*8*34
  // Sink 4 + window 256: the global layers keep 4 + 256, the local ones (their own window,
  // no sinks) the last 256.
  KvMemoryOptions sw;
  sw.sink = 4;
  sw.window = 256;
  EXPECT_EQ(kv_bytes(g, sw, 1000), (3ull * 260 + 15ull * 256) * 1024);
  // In blocks of 16: at 4100 tokens a global layer holds 257 blocks; a local one the blocks
  // from the one holding 3589 (= 4100 - 512 + 1, block 224) to block 256: 33.
  KvMemoryOptions paged;
  paged.block = 16;
  EXPECT_EQ(kv_bytes(g, paged, 4100), (3ull * 257 + 15ull * 33) * 16 * 1024);
}

TEST(KvMemory, SinksOnlyInLayersWithoutTheirOwnWindow) {
  // The engine's rules for the same choice: a layer with its own window (512) takes the
  // smaller window and no sinks; a global layer takes sink + window.
  KvCacheConfig cfg = kv_config_full({2, 1, 32}, {});
  cfg.layers[0].window = cfg.layers[0].keep = 512;
  KvLimits lim;
  lim.sink = 4;
  lim.window = 256;
  kv_limits_apply(lim, cfg);
  EXPECT_EQ(cfg.layers[0].window, 256);
  EXPECT_EQ(cfg.layers[0].sink, 0);
  EXPECT_EQ(cfg.layers[0].keep, 256);
  EXPECT_EQ(cfg.layers[1].window, 256);
  EXPECT_EQ(cfg.layers[1].sink, 4);
  EXPECT_EQ(cfg.layers[1].keep, 256);
}

TEST(KvMemory, RealCacheBytesEqualTheFormula) {
  // A cache of every type holds exactly the formula's bytes, K and V types apart too.
  const KvMemoryShape s{"tiny", 2, 4, 2, 64, {}};
  auto be = make_cpu_backend(1);
  const KvDtype all[] = {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0};
  for (KvDtype k : all)
    for (KvDtype v : all) {
      const KvTypes t{k, v};
      auto cache = be->create_kv_cache(kv_config_full({s.n_layer, s.n_head_kv, s.head_dim}, t), 4);
      ASSERT_TRUE(cache.ok()) << cache.error().message;
      ASSERT_TRUE((*cache)->begin(0, 11).ok());
      ASSERT_TRUE((*cache)->end().ok());
      EXPECT_EQ((*cache)->bytes_used(), kv_bytes(s, types(k, v), 11)) << kv_types_name(t);
    }
}

TEST(KvMemory, QuantizedTypesNeedWholeBlocksAlongTheHeadDim) {
  auto be = make_cpu_backend(1);
  auto bad = be->create_kv_cache(kv_config_full({2, 2, 16}, {KvDtype::F16, KvDtype::Q4_0}), 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("q4_0"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("16 dims"), std::string::npos) << bad.error().message;
}

TEST(KvMemory, LiveSessionBytesEqualTheFormulaOnTheDefaultModel) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model absent";
  auto m = Model::load(KVSCOPE_DEFAULT_MODEL);
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::shared_ptr<const Model> model = std::move(m.value());
  const KvMemoryShape shape = kv_memory_shape(*model);
  EXPECT_EQ(kv_bytes_per_token(shape, KvMemoryOptions{}), 23040u);
  for (KvTypes t : {KvTypes{KvDtype::F16, KvDtype::F16}, KvTypes{KvDtype::Q8_0, KvDtype::Q8_0},
                    KvTypes{KvDtype::Q4_0, KvDtype::F32}}) {
    SessionConfig cfg;
    cfg.kv_types = t;
    cfg.max_tokens = 3;
    cfg.stop_at_eos = false;
    auto s = Session::create(model, make_cpu_backend(2), cfg);
    ASSERT_TRUE(s.ok()) << s.error().message;
    ASSERT_TRUE((*s)->reset({"A short prompt", false}).ok());
    KvMemoryOptions o;
    o.types = t;
    while (!(*s)->done()) {
      auto tr = (*s)->step();
      ASSERT_TRUE(tr.ok()) << tr.error().message;
      // After a step the cache holds every position but the newest token's, in whole
      // blocks of 16 positions.
      o.block = 16;
      EXPECT_EQ(tr->kv_bytes, kv_bytes(shape, o, tr->seq_len - 1)) << kv_types_name(t);
    }
  }
}

}  // namespace
}  // namespace kvscope
