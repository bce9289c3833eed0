// test_gemma3.cpp — Gemma 3 270M (the second built-in model: sliding-window attention on
// 15 of 18 layers, MQA, Q/K norm, post norms, GELU gate, NeoX RoPE) on the CPU backend:
//  - top-5 logits after the prompt and after each of 16 greedy steps, on 3 prompts,
//    against an independent numpy fp32 reference (tests/golden/gemma3_fp32.json, made by
//    scripts/reference_forward.py --family-golden), and the free-running greedy text;
//  - the greedy check of docs/engine.md: "The capital of France is" continues with
//    " the capital of the country of France.";
//  - a run past the 512-position window to 700 tokens: CACHE and NO CACHE give the same
//    tokens and bit-identical logits;
//  - local layers' caches stop growing at the 512-position window (plus what their last
//    blocks round it up to) while global layers' keep growing, and KV_CACHE equals the
//    closed form in blocks of 16 positions;
//  - past the window: 640 tokens of a long text and 8 greedy steps against the same
//    reference (tests/golden/gemma3_window_fp32.json, --window-golden), whose logits move
//    far beyond the tolerance when the reference ignores the window.
// Skipped when the Gemma file is not fetched (scripts/fetch_model.sh gemma3-270m).
//
// Tolerances (against the fp32 reference): with an f32 KV cache the two differ only in
// fp32 summation order; over 18 blocks whose residual reaches ~1e5 that moved logits by
// 8e-5 at most (255 logits), so kTolF32 = 0.002 (as for the default model's fp32 check).
// The free-running run uses the default f16 cache; its greedy choices may differ from the
// reference only where the reference's best two logits are within kTieTol.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/session.h"
#include "tests/util/kv_blocks.h"
#include "tests/util/model_fixture.h"

namespace kvscope {
namespace {

constexpr float kTolF32 = 0.002f;
constexpr float kTieTol = 0.05f;

struct Golden {
  std::string name, prompt;
  std::vector<int32_t> prompt_ids, greedy;
  std::string greedy_text;
  std::vector<std::vector<std::pair<int32_t, float>>> top5;  // [17][5]
};

std::vector<Golden> load_golden() {
  std::ifstream in(std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/gemma3_fp32.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Golden> out;
  for (const auto& p : j.at("prompts")) {
    Golden g;
    g.name = p.at("name");
    g.prompt = p.at("prompt");
    g.prompt_ids = p.at("prompt_ids").get<std::vector<int32_t>>();
    g.greedy = p.at("greedy_ids").get<std::vector<int32_t>>();
    g.greedy_text = p.at("greedy_text");
    for (const auto& step : p.at("top5")) {
      std::vector<std::pair<int32_t, float>> t;
      for (const auto& e : step) t.push_back({e.at(0).get<int32_t>(), e.at(1).get<float>()});
      g.top5.push_back(t);
    }
    // The top-5 after the prompt and after each of the 16 greedy tokens.
    EXPECT_EQ(g.top5.size(), g.greedy.size() + 1) << g.name;
    EXPECT_GE(g.greedy.size(), 16u) << g.name;
    out.push_back(g);
  }
  // The file holds 3 prompts; a truncated or empty file must not pass for a match.
  EXPECT_GE(out.size(), 3u) << "tests/golden/gemma3_fp32.json";
  return out;
}

class Gemma3 : public ModelTest<GemmaModelFile> {
 protected:
  std::unique_ptr<Session> make(CacheMode mode, int max_tokens) {
    return session(config(mode, max_tokens));
  }
};

TEST_F(Gemma3, DescriptionMatchesTheFile) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.n_layer, 18);
  EXPECT_EQ(c.n_embd, 640);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_FLOAT_EQ(c.attn_scale, 0.0625f);
  EXPECT_FLOAT_EQ(c.embd_scale, std::sqrt(640.0f));
  for (int l = 0; l < 18; ++l) {
    const bool global = l == 5 || l == 11 || l == 17;
    EXPECT_EQ(c.layers[size_t(l)].window, global ? 0 : 512) << "layer " << l;
    EXPECT_FLOAT_EQ(c.layers[size_t(l)].rope_base, global ? 1e6f : 1e4f) << "layer " << l;
  }
}

// Teacher-forced along the reference's greedy path with an f32 cache: every reference
// top-5 logit within kTolF32, and our top-1 is the reference's unless it is a near-tie.
TEST_F(Gemma3, TopFiveMatchTheFp32ReferenceAlongItsGreedyPath) {
  const ModelConfig& c = model_->config();
  auto be = make_cpu_backend(2);
  float worst = 0;
  int compared = 0;
  for (const Golden& g : load_golden()) {
    auto cache = be->create_kv_cache(
        kv_cache_config(*model_, {KvDtype::F32, KvDtype::F32}, KvPolicy::ModelWindow), 64);
    ASSERT_TRUE(cache.ok());
    ForwardOutput out;
    ASSERT_TRUE(
        forward(*be, *model_, g.prompt_ids.data(), int(g.prompt_ids.size()), 0, **cache, out).ok());
    for (size_t k = 0; k < g.top5.size(); ++k) {
      if (k > 0) {
        const int32_t tok = g.greedy[k - 1];
        ASSERT_TRUE(forward(*be, *model_, &tok, 1, (*cache)->length(), **cache, out).ok());
      }
      ASSERT_EQ(out.logits.size(), size_t(c.n_vocab));
      for (const auto& [id, want] : g.top5[k]) {
        const float got = out.logits[size_t(id)];
        worst = std::max(worst, std::fabs(got - want));
        ++compared;
        EXPECT_NEAR(got, want, kTolF32) << g.name << " step " << k << " id " << id;
      }
      const int32_t ours =
          int32_t(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
      if (ours != g.top5[k][0].first) {
        EXPECT_LT(g.top5[k][0].second - g.top5[k][1].second, kTieTol) << g.name << " step " << k;
      }
    }
  }
  std::printf("largest difference from the fp32 reference: %.5f over %d logits\n", worst, compared);
}

// Free running through the Session (default f16 cache, the tokenizer on the prompt text):
// the prompt ids are llama.cpp's, and the 16 greedy tokens are the reference's unless the
// paths part at a near-tie. The first prompt is docs/engine.md's greedy check.
TEST_F(Gemma3, GreedyTextMatchesTheReferenceAndTheCapitalOfFranceFact) {
  for (const Golden& g : load_golden()) {
    auto s = make(CacheMode::Cache, int(g.greedy.size()));
    ASSERT_TRUE(s->reset({g.prompt, false}).ok());
    EXPECT_EQ(s->tokens(), g.prompt_ids) << g.name;
    size_t k = 0;
    for (; k < g.greedy.size(); ++k) {
      auto tr = s->step();
      ASSERT_TRUE(tr.ok()) << tr.error().message;
      if (tr->token_id != g.greedy[k]) break;
    }
    if (k < g.greedy.size()) {
      EXPECT_LT(g.top5[k][0].second - g.top5[k][1].second, kTieTol)
          << g.name << ": left the reference's path at step " << k;
    } else {
      EXPECT_EQ(s->generated_text(), g.greedy_text) << g.name;
    }
    if (g.name == "capital") {
      EXPECT_EQ(g.prompt_ids, (std::vector<int32_t>{2, 818, 5279, 529, 7001, 563}));
      EXPECT_EQ(s->generated_text().rfind(" the capital of the country of France.", 0), 0u)
          << s->generated_text();
    }
  }
}

// A prompt of `n` tokens: a story sentence repeated (BOS first).
std::vector<int32_t> long_prompt(const Model& m, int n) {
  std::vector<int32_t> ids = {m.tokenizer().bos_id()};
  while (int(ids.size()) < n) {
    auto more = m.tokenizer().encode(
        " The lighthouse keeper climbed the narrow stairs every evening, counting the steps "
        "and listening to the sea below.",
        false);
    EXPECT_TRUE(more.ok());
    ids.insert(ids.end(), more->begin(), more->end());
  }
  ids.resize(size_t(n));
  return ids;
}

// KV bytes per position of one layer (1 kv head x 256 dims, K and V, f16).
constexpr uint64_t kPosBytes = 2 * 1 * 256 * 2;

// A 690-token prompt and 10 greedy steps to 700 positions, past the 512 window: a CACHE
// run and a run that switches to NO CACHE for its last two steps give the same tokens and
// bit-identical logits; after each CACHE step every local layer holds the blocks of the
// last 512 positions, every global layer all of them.
TEST_F(Gemma3, SevenHundredTokensPastTheWindowCacheEqualsNoCache) {
  const int P = 690, G = 11;
  const std::vector<int32_t> prompt = long_prompt(*model_, P);
  auto a = make(CacheMode::Cache, G), b = make(CacheMode::Cache, G);
  ASSERT_TRUE(a->reset_tokens(prompt).ok());
  ASSERT_TRUE(b->reset_tokens(prompt).ok());
  for (int i = 0; i < G; ++i) {
    if (i == G - 2) {
      ASSERT_TRUE(b->set_mode(CacheMode::NoCache).ok());
    }
    auto ta = a->step();
    auto tb = b->step();
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_EQ(ta->token_id, tb->token_id) << "step " << i;
    EXPECT_EQ(a->last_logits(), b->last_logits()) << "step " << i;
    if (i >= G - 2) {
      EXPECT_EQ(tb->mode, CacheMode::NoCache);
      EXPECT_EQ(tb->tokens_processed, P + i) << "NO CACHE recomputes the whole sequence";
    }
    const int n = P + i;  // positions in the cache after the step
    uint64_t bytes = 0;
    for (int l = 0; l < 18; ++l) {
      const bool global = l == 5 || l == 11 || l == 17;
      const KvLayerState& ks = ta->kv_layers[size_t(l)];
      const test::PagedHeld h = test::paged_held(n, global ? 0 : 512);
      EXPECT_EQ(ks.held, (std::vector<KvRange>{h.held})) << "layer " << l << " step " << i;
      EXPECT_EQ(ks.bytes, h.blocks * 16 * kPosBytes);
      bytes += ks.bytes;
    }
    EXPECT_EQ(ta->kv_bytes, bytes);
    EXPECT_EQ(ta->kv_bytes, (15 * test::paged_layer_bytes(n, 512, kPosBytes) +
                             3 * test::paged_layer_bytes(n, 0, kPosBytes)));
    EXPECT_EQ(ta->kv_bytes, bytes);
  }
  EXPECT_EQ(a->tokens().size(), size_t(P + G));
  EXPECT_EQ(a->tokens(), b->tokens());
}

// Crossing the window during decode: local layers grow one block of 16 positions at a time
// until the window fills and then hold 33 or 34 blocks (512 positions and the partly
// used ends), global layers keep growing; KV_CACHE is 1024 B per position of each block held.
TEST_F(Gemma3, LocalLayersStopGrowingAtTheWindowGlobalLayersKeepGrowing) {
  const int P = 506, G = 12;
  auto s = make(CacheMode::Cache, G);
  ASSERT_TRUE(s->reset_tokens(long_prompt(*model_, P)).ok());
  uint64_t prev_local = 0, prev_global = 0;
  for (int i = 0; i < G; ++i) {
    auto t = s->step();
    ASSERT_TRUE(t.ok());
    const int n = P + i;
    const uint64_t local = t->kv_layers[0].bytes, global = t->kv_layers[5].bytes;
    // By hand: blocks of 16 from the one holding position n - 511 to the one holding n - 1.
    const uint64_t local_blocks = uint64_t((n - 1) / 16 - std::max(0, n - 511) / 16 + 1);
    EXPECT_EQ(local, local_blocks * 16 * kPosBytes) << "n " << n;
    EXPECT_EQ(global, uint64_t((n + 15) / 16) * 16 * kPosBytes) << "n " << n;
    EXPECT_LE(local, 34 * 16 * kPosBytes) << "a local layer holds its window and two part blocks";
    if (i > 0) {
      EXPECT_EQ(global - prev_global, n % 16 == 1 ? 16 * kPosBytes : 0) << "n " << n;
      if (n <= 512) {
        EXPECT_EQ(local - prev_local, n % 16 == 1 ? 16 * kPosBytes : 0) << "n " << n;
      }
    }
    prev_local = local;
    prev_global = global;
    EXPECT_EQ(t->kv_bytes, 15 * local + 3 * global);
  }
}

// Past the window, against the fp32 reference: a 640-token prompt in one batch (local
// layers mask keys 512 or more back inside the batch) then 8 decode steps (local layers'
// rings have wrapped), teacher-forced along the reference's greedy path with an f32 cache.
// The golden file also records how far the same logits move when the reference ignores
// the window; the tolerance must be far below that, so a wrong window cannot pass.
TEST_F(Gemma3, PastTheWindowTopFiveMatchTheFp32Reference) {
  std::ifstream in(std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/gemma3_window_fp32.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const auto prompt = j.at("prompt_ids").get<std::vector<int32_t>>();
  const auto greedy = j.at("greedy_ids").get<std::vector<int32_t>>();
  const float no_window = j.at("no_window_max_diff").get<float>();
  ASSERT_GT(prompt.size(), 512u);
  EXPECT_GT(no_window, 50 * kTolF32) << "the golden prompt does not tell a window from none";
  const ModelConfig& c = model_->config();
  auto be = make_cpu_backend(2);
  auto cache = be->create_kv_cache(
      kv_cache_config(*model_, {KvDtype::F32, KvDtype::F32}, KvPolicy::ModelWindow), 1024);
  ASSERT_TRUE(cache.ok());
  ForwardOutput out;
  ASSERT_TRUE(forward(*be, *model_, prompt.data(), int(prompt.size()), 0, **cache, out).ok());
  float worst = 0;
  const auto& tops = j.at("top5");
  for (size_t k = 0; k < tops.size(); ++k) {
    if (k > 0) {
      ASSERT_TRUE(forward(*be, *model_, &greedy[k - 1], 1, (*cache)->length(), **cache, out).ok());
    }
    ASSERT_EQ(out.logits.size(), size_t(c.n_vocab));
    for (const auto& e : tops[k]) {
      const float got = out.logits[e.at(0).get<size_t>()], want = e.at(1).get<float>();
      worst = std::max(worst, std::fabs(got - want));
      EXPECT_NEAR(got, want, kTolF32) << "step " << k << " id " << e.at(0);
    }
  }
  std::printf("past the window: largest difference %.5f (ignoring the window moves them %.3f)\n",
              worst, no_window);
}

}  // namespace
}  // namespace kvscope
