// test_families.cpp — the model description for llama, gemma3 and qwen2 read from tiny
// random-weight GGUF files written by the test writer, the one forward run on each of
// them in both cache modes (windows smaller than the sequence: CACHE and NO CACHE give
// bit-identical logits and tokens), hand-worked values for the new CPU ops, and one
// clear error for an unknown architecture, a missing tensor and a window larger than
// the context.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>

#include "engine/cpu/cpu_backend.h"
#include "engine/forward.h"
#include "engine/session.h"
#include "tests/util/kv_blocks.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

std::string tmp_path(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("kvscope_fam_" + tag + "_" + std::to_string(getpid()) + ".gguf"))
      .string();
}

Expected<std::shared_ptr<Model>> load(const test::TinyModelSpec& spec) {
  const std::string path = tmp_path(spec.arch);
  if (Status s = test::write_tiny_model(spec, path); !s.ok()) return s.error();
  auto m = Model::load(path);
  std::filesystem::remove(path);  // the mapping stays valid after unlinking
  return m;
}

test::TinyModelSpec tiny_gemma3() {
  return test::tiny_family("gemma3", 21);
}
test::TinyModelSpec tiny_qwen2() {
  return test::tiny_family("qwen2", 22);
}

TEST(Families, DescriptionsAreReadFromTheFile) {
  auto g = load(tiny_gemma3());
  ASSERT_TRUE(g.ok()) << g.error().message;
  const ModelConfig& c = (*g)->config();
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_EQ(c.attn_width(), 96);
  EXPECT_NE(c.attn_width(), c.n_embd);
  EXPECT_EQ(c.rope_style, RopeStyle::NeoX);
  EXPECT_EQ(c.ffn_act, FfnAct::GeluTanh);
  EXPECT_FLOAT_EQ(c.embd_scale, 8.0f);  // sqrt(64)
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(24.0f));
  EXPECT_TRUE(c.qk_norm && c.post_attn_norm && c.post_ffn_norm);
  EXPECT_FALSE(c.qkv_bias);
  ASSERT_EQ(c.layers.size(), 3u);
  // Local layers: the window and the built-in local RoPE base; the global one: the file's.
  EXPECT_EQ(c.layers[0].window, 5);
  EXPECT_EQ(c.layers[1].window, 5);
  EXPECT_EQ(c.layers[2].window, 0);
  EXPECT_FLOAT_EQ(c.layers[0].rope_base, 10000.0f);
  EXPECT_FLOAT_EQ(c.layers[2].rope_base, 1e6f);

  // Without a pattern key every 6th layer is global (layers 5 and 11 of 12).
  test::TinyModelSpec p = tiny_gemma3();
  p.n_layer = 12;
  p.swa_pattern.clear();
  auto g12 = load(p);
  ASSERT_TRUE(g12.ok()) << g12.error().message;
  for (int l = 0; l < 12; ++l)
    EXPECT_EQ((*g12)->config().layers[size_t(l)].window, l % 6 == 5 ? 0 : 5) << "layer " << l;

  auto q = load(tiny_qwen2());
  ASSERT_TRUE(q.ok()) << q.error().message;
  EXPECT_TRUE((*q)->config().qkv_bias);
  EXPECT_EQ((*q)->config().rope_style, RopeStyle::NeoX);
  EXPECT_EQ((*q)->config().ffn_act, FfnAct::Silu);
  EXPECT_NE((*q)->layers()[0].bq.data, nullptr);

  test::TinyModelSpec l;
  auto ll = load(l);
  ASSERT_TRUE(ll.ok());
  EXPECT_EQ((*ll)->config().rope_style, RopeStyle::Adjacent);
  EXPECT_FLOAT_EQ((*ll)->config().embd_scale, 1.0f);
  EXPECT_FALSE((*ll)->config().qk_norm || (*ll)->config().qkv_bias);
}

// Runs `steps` greedy steps in one mode; returns the per-step traces and logits.
struct RunResult {
  std::vector<StepTrace> steps;
  std::vector<std::vector<float>> logits;
};
RunResult run(std::shared_ptr<const Model> m, CacheMode mode, int steps) {
  SessionConfig cfg;
  cfg.mode = mode;
  cfg.max_tokens = steps;
  cfg.stop_at_eos = false;
  auto s = Session::create(std::move(m), make_cpu_backend(2), cfg);
  EXPECT_TRUE(s.ok());
  RunResult r;
  if (!s.ok()) return r;
  EXPECT_TRUE((*s)->reset({"hi there", false}).ok());  // 8 byte-level tokens
  while (!(*s)->done()) {
    auto t = (*s)->step();
    EXPECT_TRUE(t.ok()) << t.error().message;
    if (!t.ok()) break;
    r.steps.push_back(std::move(*t));
    r.logits.push_back((*s)->last_logits());
  }
  return r;
}

TEST(Families, CacheEqualsNoCacheBitForBitOnEveryFamily) {
  test::TinyModelSpec llama;
  llama.seed = 23;
  for (const test::TinyModelSpec& spec : {llama, tiny_gemma3(), tiny_qwen2()}) {
    SCOPED_TRACE(spec.arch);
    auto m = load(spec);
    ASSERT_TRUE(m.ok()) << m.error().message;
    std::shared_ptr<const Model> model = std::move(*m);
    const ModelConfig& c = model->config();
    RunResult a = run(model, CacheMode::Cache, 24), b = run(model, CacheMode::NoCache, 24);
    ASSERT_EQ(a.steps.size(), 24u);
    ASSERT_EQ(b.steps.size(), 24u);
    const uint64_t pos_bytes = kv_position_bytes({c.n_layer, c.n_head_kv, c.head_dim}, KvTypes{});
    for (size_t i = 0; i < a.steps.size(); ++i) {
      ASSERT_EQ(a.steps[i].token_id, b.steps[i].token_id) << "step " << i;
      EXPECT_EQ(a.logits[i], b.logits[i]) << "step " << i;
      EXPECT_EQ(a.steps[i].attention, b.steps[i].attention) << "step " << i;
      // What each layer holds after the step: its window's worth on local layers.
      const int n = a.steps[i].seq_len - 1;  // positions through the cache
      ASSERT_EQ(a.steps[i].kv_layers.size(), size_t(c.n_layer));
      uint64_t bytes = 0;
      for (int l = 0; l < c.n_layer; ++l) {
        const int W = c.layers[size_t(l)].window;
        const test::PagedHeld h = test::paged_held(n, W);
        const KvLayerState& ks = a.steps[i].kv_layers[size_t(l)];
        EXPECT_EQ(ks.window, W);
        EXPECT_EQ(ks.held, (std::vector<KvRange>{h.held})) << "layer " << l;
        EXPECT_EQ(ks.bytes, h.blocks * test::kSessionBlock * pos_bytes);
        bytes += h.blocks * test::kSessionBlock * pos_bytes;
      }
      EXPECT_EQ(a.steps[i].kv_bytes, bytes);
    }
  }
}

// A prompt longer than one batch (forward.cpp: 512 tokens) goes through in batches, so a
// windowed layer's ring never has to hold the whole prompt; every result equals feeding
// the same tokens in calls of 100 (each one batch): logits, the last query's attention
// rows and every K/V row norm, bit for bit, and FLOPs by the closed form.
TEST(Families, LongPromptsGoThroughInBatchesWithTheSameResults) {
  test::TinyModelSpec spec = tiny_gemma3();
  spec.n_ctx = 2048;
  auto m = load(spec);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Model& model = **m;
  const int L = model.config().n_layer, T = 1100;
  std::vector<int32_t> ids(T);
  for (int t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 37 + 11) % model.config().n_vocab);
  auto be = make_cpu_backend(2);
  const KvCacheConfig cfg = kv_cache_config(model, KvTypes{}, KvPolicy::ModelWindow);
  auto one = be->create_kv_cache(cfg, 64), pieces = be->create_kv_cache(cfg, 64);
  ASSERT_TRUE(one.ok() && pieces.ok());
  ForwardOutput a;
  ASSERT_TRUE(forward(*be, model, ids.data(), T, 0, **one, a).ok());
  std::vector<float> k_norm(size_t(L) * T), v_norm(size_t(L) * T);
  ForwardOutput b;
  for (int t0 = 0; t0 < T; t0 += 100) {
    ASSERT_TRUE(forward(*be, model, ids.data() + t0, 100, t0, **pieces, b).ok());
    for (int l = 0; l < L; ++l)
      for (int i = 0; i < 100; ++i) {
        k_norm[size_t(l * T + t0 + i)] = b.k_norm[size_t(l * 100 + i)];
        v_norm[size_t(l * T + t0 + i)] = b.v_norm[size_t(l * 100 + i)];
      }
  }
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.attention, b.attention);
  EXPECT_EQ(a.k_norm, k_norm);
  EXPECT_EQ(a.v_norm, v_norm);
  std::vector<KvLayerRule> rules;
  for (int l = 0; l < L; ++l) rules.push_back((*one)->rule(l));
  EXPECT_EQ(a.flops, forward_flops(model, rules, T, 0));
  EXPECT_EQ(a.kv_rows, uint64_t(T) * L);
  // Windowed layers hold their last 5 positions, the global one all 1,100.
  for (int l = 0; l < L; ++l)
    EXPECT_EQ((*one)->held_ranges(l), (*pieces)->held_ranges(l)) << "layer " << l;
  EXPECT_EQ((*one)->held(0), 5);
  EXPECT_EQ((*one)->held(2), T);
}

TEST(Families, UnknownArchitectureMissingTensorAndOversizedWindowAreClearErrors) {
  test::TinyModelSpec unknown;
  unknown.arch = "mamba";
  auto u = load(unknown);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.error().message.find("architecture 'mamba' is not supported"), std::string::npos)
      << u.error().message;
  EXPECT_NE(u.error().message.find("llama, gemma3 and qwen2"), std::string::npos);

  test::TinyModelSpec no_norm = tiny_gemma3();
  no_norm.skip_tensor = "blk.1.attn_k_norm.weight";
  auto n = load(no_norm);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("tensor 'blk.1.attn_k_norm.weight' is missing"),
            std::string::npos)
      << n.error().message;

  test::TinyModelSpec no_bias = tiny_qwen2();
  no_bias.skip_tensor = "blk.0.attn_v.bias";
  auto b = load(no_bias);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("tensor 'blk.0.attn_v.bias' is missing"), std::string::npos)
      << b.error().message;

  test::TinyModelSpec wide = tiny_gemma3();
  wide.window = 300;  // n_ctx is 256
  auto w = load(wide);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("sliding_window 300 is larger than the context length 256"),
            std::string::npos)
      << w.error().message;
}

// The new element-wise ops against values worked out by hand.
TEST(Families, CpuOpsMatchHandWorkedValues) {
  auto be = make_cpu_backend(1);
  // NeoX RoPE, D = 4, position 1, base 100: pairs (0, 2) by 1 rad and (1, 3) by 0.1 rad.
  auto x = be->scratch(0, 1, 4);
  ASSERT_TRUE(x.ok());
  const float in[4] = {1, 2, 3, 4};
  std::copy(in, in + 4, x->data);
  ASSERT_TRUE(be->rope(*x, 1, 4, RopeSpec{RopeStyle::NeoX, 4, 100.0f, 1.0f}, 1).ok());
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.1), s2 = std::sin(0.1);
  EXPECT_NEAR(x->data[0], 1 * c1 - 3 * s1, 1e-6);
  EXPECT_NEAR(x->data[2], 1 * s1 + 3 * c1, 1e-6);
  EXPECT_NEAR(x->data[1], 2 * c2 - 4 * s2, 1e-6);
  EXPECT_NEAR(x->data[3], 2 * s2 + 4 * c2, 1e-6);
  // Adjacent pairs with linear scaling 1/2 at position 2: pair (0, 1) by 1 rad.
  std::copy(in, in + 4, x->data);
  ASSERT_TRUE(be->rope(*x, 1, 4, RopeSpec{RopeStyle::Adjacent, 2, 100.0f, 0.5f}, 2).ok());
  EXPECT_NEAR(x->data[0], 1 * c1 - 2 * s1, 1e-6);
  EXPECT_NEAR(x->data[1], 1 * s1 + 2 * c1, 1e-6);
  EXPECT_EQ(x->data[2], 3.0f);  // past n_rot: untouched
  // GELU (tanh form) gate: gelu(1) = 0.5(1 + tanh(0.7978846 * 1.044715)) = 0.8411920,
  // gelu(-1) = -0.1588080; times up = 2. SiLU(1) = 1 / (1 + e^-1) = 0.7310586.
  auto g = be->scratch(1, 1, 2), u = be->scratch(2, 1, 2);
  ASSERT_TRUE(g.ok() && u.ok());
  g->data[0] = 1;
  g->data[1] = -1;
  u->data[0] = u->data[1] = 2;
  ASSERT_TRUE(be->glu(*g, *u, FfnAct::GeluTanh, *g).ok());
  EXPECT_NEAR(g->data[0], 2 * 0.8411920, 2e-6);
  EXPECT_NEAR(g->data[1], 2 * -0.1588080, 2e-6);
  g->data[0] = 1;
  ASSERT_TRUE(be->glu(*g, *u, FfnAct::Silu, *g).ok());
  EXPECT_NEAR(g->data[0], 2 * 0.7310586, 2e-6);
  // Bias add on two rows; embedding scale.
  auto q = load(tiny_qwen2());
  ASSERT_TRUE(q.ok());
  const Weight& bk = (*q)->layers()[0].bk;
  auto k = be->scratch(3, 2, bk.n_in);
  ASSERT_TRUE(k.ok());
  std::fill_n(k->data, k->size(), 1.0f);
  ASSERT_TRUE(be->add_bias(*k, bk).ok());
  const float* b = reinterpret_cast<const float*>(bk.data);
  for (int64_t i = 0; i < bk.n_in; ++i) {
    EXPECT_EQ(k->data[i], 1.0f + b[i]);
    EXPECT_EQ(k->data[bk.n_in + i], 1.0f + b[i]);
  }
  const Weight& emb = (*q)->tok_embd();
  auto e1 = be->scratch(4, 1, emb.n_in), e2 = be->scratch(5, 1, emb.n_in);
  ASSERT_TRUE(e1.ok() && e2.ok());
  const int32_t id = 7;
  ASSERT_TRUE(be->embed(emb, &id, 1.0f, *e1).ok());
  ASSERT_TRUE(be->embed(emb, &id, 8.0f, *e2).ok());
  for (int64_t i = 0; i < emb.n_in; ++i) EXPECT_EQ(e2->data[i], 8.0f * e1->data[i]);
}

}  // namespace
}  // namespace kvscope
