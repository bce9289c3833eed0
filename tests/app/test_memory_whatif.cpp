// test_memory_whatif.cpp — the memory what-if panel's numbers against hand-worked values:
// the reference shapes (512 KiB per token for a 32-layer 4096-wide model in fp16,
// 320 KiB for a 70B model with 8 KV heads of 128) at a chosen context, per cache type,
// with sink + window, without GQA, a Gemma-style model with and without its own windows;
// and a real run's held bytes equal to the formula for its settings (f16, q8_0, sink +
// window), as the panel shows them side by side.
#include <gtest/gtest.h>

#include <filesystem>

#include "app/ui/app_capture.h"
#include "app/scene/capture.h"
#include "app/core/engine_setup.h"
#include "app/core/memory_whatif.h"
#include "app/ui/ui_state.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

const WhatIfRow& find(const std::vector<WhatIfRow>& rows, const std::string& prefix) {
  for (const WhatIfRow& r : rows)
    if (r.name.rfind(prefix, 0) == 0) return r;
  ADD_FAILURE() << "no row " << prefix;
  static WhatIfRow none;
  return none;
}

// SmolLM2-135M's shape: 30 layers, 9 query heads, 3 KV heads of 64.
const KvMemoryShape kSmol{"SmolLM2-135M", 30, 9, 3, 64, {}};

// Gemma 3 270M's shape: 18 layers, 4 query heads, 1 KV head of 256; every sixth layer
// global, the others windowed at 512.
KvMemoryShape gemma_shape() {
  KvMemoryShape s{"Gemma 3 270M", 18, 4, 1, 256, {}};
  for (int l = 0; l < 18; ++l) s.layer_window.push_back((l + 1) % 6 == 0 ? 0 : 512);
  return s;
}

}  // namespace

TEST(MemoryWhatIf, SeedReferenceShapesAtAChosenContext) {
  WhatIfChoice f16;
  const auto rows = whatif_models(kSmol, f16, 100000);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].name, "SmolLM2-135M");  // this model first
  // 2 (K, V) x 32 layers x 4096 x 2 bytes = 524,288 B per token; x 100,000 tokens.
  const WhatIfRow& big = find(rows, "32 layers");
  EXPECT_EQ(big.per_token, 524288u);
  EXPECT_EQ(big.at_ctx, 52428800000ull);
  EXPECT_EQ(format_bytes(big.per_token), "512.0 KiB");
  EXPECT_EQ(format_bytes(big.at_ctx), "48.83 GiB");
  // 2 x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 B per token.
  const WhatIfRow& b70 = find(rows, "70B");
  EXPECT_EQ(b70.per_token, 327680u);
  EXPECT_EQ(b70.at_ctx, 32768000000ull);
  EXPECT_EQ(format_bytes(b70.per_token), "320.0 KiB");
  EXPECT_EQ(format_bytes(b70.at_ctx), "30.52 GiB");
  // SmolLM2: 2 x 30 x 3 x 64 x 2 = 23,040 B per token.
  EXPECT_EQ(rows[0].per_token, 23040u);
  EXPECT_EQ(rows[0].at_ctx, 2304000000ull);

  // Without GQA the 70B model holds 64 KV heads: 8x; the 32-layer model is unchanged.
  WhatIfChoice mha;
  mha.one_kv_head_per_query_head = true;
  const auto m = whatif_models(kSmol, mha, 100000);
  EXPECT_EQ(find(m, "70B").per_token, 2621440u);
  EXPECT_EQ(find(m, "32 layers").per_token, 524288u);
  EXPECT_EQ(m[0].per_token, 69120u);  // 9 KV heads: 3x

  // q8_0: 34 bytes per 32 values; 70B: 80 x 8 x 2 x (128 / 32 x 34) = 174,080 B.
  WhatIfChoice q8;
  q8.types = {KvDtype::Q8_0, KvDtype::Q8_0};
  EXPECT_EQ(find(whatif_models(kSmol, q8, 1), "70B").per_token, 174080u);
  // K in q4_0 (18 B per 32) and V in f16: 80 x 8 x (72 + 256) = 209,920 B.
  WhatIfChoice mixed;
  mixed.types = {KvDtype::Q4_0, KvDtype::F16};
  EXPECT_EQ(find(whatif_models(kSmol, mixed, 1), "70B").per_token, 209920u);
}

TEST(MemoryWhatIf, CacheTypesWindowsAndTheModelsOwnWindows) {
  WhatIfChoice c;
  const auto types = whatif_types(kSmol, c, 1000);
  ASSERT_EQ(types.size(), 4u);
  EXPECT_EQ(types[0].name, "f32");
  EXPECT_EQ(types[0].per_token, 46080u);
  EXPECT_EQ(types[1].per_token, 23040u);
  EXPECT_EQ(types[2].per_token, 12240u);  // 30 x 2 x 3 x 68
  EXPECT_EQ(types[3].per_token, 6480u);   // 30 x 2 x 3 x 36
  EXPECT_EQ(types[3].at_ctx, 6480000u);

  // Sink 4 + window 256: the cache stops at 260 positions per layer.
  WhatIfChoice sw;
  sw.sink = 4;
  sw.window = 256;
  EXPECT_EQ(whatif_models(kSmol, sw, 100000)[0].at_ctx, 260ull * 23040);
  EXPECT_EQ(whatif_models(kSmol, sw, 100)[0].at_ctx, 100ull * 23040);

  // Gemma 3: 18 x 2 x 1 x 256 x 2 = 18,432 B per token; at 2,000 tokens the 3 global
  // layers hold 2,000 positions and the 15 local ones 512: 3 x 2000 x 1024 + 15 x 512 x 1024.
  const KvMemoryShape g = gemma_shape();
  WhatIfChoice own;
  const auto with = whatif_models(g, own, 2000);
  EXPECT_EQ(with[0].per_token, 18432u);
  EXPECT_EQ(with[0].at_ctx, 3ull * 2000 * 1024 + 15ull * 512 * 1024);
  WhatIfChoice none;
  none.model_window = false;
  EXPECT_EQ(whatif_models(g, none, 2000)[0].at_ctx, 18ull * 2000 * 1024);
  // Its own windows do not apply to the reference shapes.
  EXPECT_EQ(find(with, "70B").at_ctx, 2000ull * 327680);

  // The live section: held next to the formula, without the window, GQA against MHA.
  const LiveKv l = live_kv(g, own, 2000, 14008320);
  EXPECT_EQ(l.formula, 14008320u);
  EXPECT_EQ(l.without_window, 36864000u);
  EXPECT_EQ(l.per_token, 18432u);
  EXPECT_EQ(l.per_token_mha, 4u * 18432);  // 4 query heads share 1 KV head
}

TEST(MemoryWhatIf, ARealRunHoldsWhatTheFormulaSays) {
  if (!std::filesystem::exists(KVSCOPE_DEFAULT_MODEL)) GTEST_SKIP() << "default model not found";
  struct Case {
    KvDtype k, v;
    int sink, window;
  };
  for (Case cs : {Case{KvDtype::F16, KvDtype::F16, 0, 0}, Case{KvDtype::Q8_0, KvDtype::F16, 0, 0},
                  Case{KvDtype::F16, KvDtype::F16, 4, 16}}) {
    EngineOptions eo;
    eo.model_path = KVSCOPE_DEFAULT_MODEL;
    eo.backend = "cpu";
    eo.kv_types = {cs.k, cs.v};
    eo.limits.sink = cs.sink;
    eo.limits.window = cs.window;
    auto eng = open_engine(eo);
    ASSERT_TRUE(eng.ok()) << eng.error().message;
    Timeline tl;
    ASSERT_TRUE(run_steps(*eng.value().session, {"Once upon a time, in a small village by the sea, there lived an old fisherman who "
                                   "went out every morning before dawn to cast his nets, and", false},
                          60, &tl).ok());
    const StepTrace* t = tl.last();
    ASSERT_NE(t, nullptr);
    const ModelFacts facts = model_facts(eng.value());
    const WhatIfChoice run = run_kv_choice(eo.kv_types, eo.limits, eo.kv_block);
    EXPECT_EQ(run.types.k, cs.k);
    EXPECT_EQ(run.block, 16);
    const int cached = t->kv_first_pos + t->kv_written;
    ASSERT_GT(cached, 48);
    const LiveKv l = live_kv(facts_memory_shape(facts), run, cached, t->kv_bytes);
    EXPECT_EQ(l.held, l.in_blocks) << kv_dtype_name(cs.k) << " sink " << cs.sink;
    if (cs.window > 0) {
      // Positions: the sinks and the window. Blocks by hand: the sinks' block 0 and the
      // blocks from the one holding position cached - 15 (the oldest key the next query
      // sees) to the last.
      EXPECT_EQ(l.formula, uint64_t(cs.sink + cs.window) * l.per_token);
      const uint64_t blocks = 1 + uint64_t((cached - 1) / 16 - (cached - cs.window + 1) / 16 + 1);
      EXPECT_EQ(l.held, blocks * 16 * l.per_token);
      EXPECT_GT(l.without_window, l.held);
    } else {
      EXPECT_EQ(l.formula, uint64_t(cached) * l.per_token);
      EXPECT_EQ(l.held, uint64_t(cached + 15) / 16 * 16 * l.per_token);
      EXPECT_EQ(l.without_window, l.held);
    }
  }
}
