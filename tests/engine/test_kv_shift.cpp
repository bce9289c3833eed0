// test_kv_shift.cpp — the context shift (llama.cpp's): KvCache::shift drops a range of
// positions from every layer and renumbers the later ones, whose rows move with them (full
// layers and windowed rings alike); kv_rerotate makes a moved K row equal the row RoPE
// computes directly at its new position (per cache type, within a stated tolerance); a
// session whose context fills keeps the first n_keep tokens and drops the oldest half of
// the rest, its cache never holds more than the context, and KV CACHE and NO CACHE (which
// replays the shifts) give the same tokens — on the default model, and on a tiny Gemma 3
// whose windowed layers are rings; bad ranges and settings are errors.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <random>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_kv_cache.h"
#include "engine/forward.h"
#include "engine/session.h"
#include "tests/util/model_fixture.h"
#include "tests/util/kv_positions.h"
#include "tests/util/tiny_model.h"

namespace kvscope {
namespace {

constexpr int kHkv = 2, kD = 8;

using test::write_positions;

// The position whose rows `layer` holds at position p (from the rows' norm).
int source_of(Backend& be, const KvCache& cache, int layer, int p) {
  auto kn = be.scratch(2, 1, 1);
  auto vn = be.scratch(3, 1, 1);
  EXPECT_TRUE(be.kv_row_norms(cache, layer, p, 1, *kn, *vn).ok());
  EXPECT_NEAR(kn->data[0], vn->data[0], 1e-3f);
  return int(std::lround(kn->data[0] / std::sqrt(float(kHkv * kD)))) - 1;
}

TEST(KvShift, DropsARangeAndRenumbersTheRest) {
  auto be = make_cpu_backend(1);
  // Layer 0 holds everything; layer 1 is a ring of the last 8 positions (window 8).
  KvCacheConfig cfg = kv_config_full({2, kHkv, kD}, {KvDtype::F32, KvDtype::F32});
  cfg.layers[1] = KvLayerRule{8, 0, 8};
  auto made = be->create_kv_cache(cfg, 4);
  ASSERT_TRUE(made.ok()) << made.error().message;
  KvCache& c = **made;
  write_positions(*be, c, 0, 20);
  // Keep [0, 4), drop [4, 12): positions 12..19 become 4..11.
  ASSERT_TRUE(c.shift(4, 8).ok());
  EXPECT_EQ(c.length(), 12);
  EXPECT_EQ(c.held_ranges(0), (std::vector<KvRange>{{0, 12}}));
  EXPECT_EQ(c.held_ranges(1), (std::vector<KvRange>{{4, 12}}));
  for (int p = 0; p < 12; ++p) EXPECT_EQ(source_of(*be, c, 0, p), p < 4 ? p : p + 8) << p;
  for (int p = 4; p < 12; ++p) EXPECT_EQ(source_of(*be, c, 1, p), p + 8) << p;
  // Writing goes on at the new length, into the right slots.
  write_positions(*be, c, 12, 3);
  EXPECT_EQ(c.held_ranges(0), (std::vector<KvRange>{{0, 15}}));
  EXPECT_EQ(c.held_ranges(1), (std::vector<KvRange>{{7, 15}}));
  EXPECT_EQ(source_of(*be, c, 0, 11), 19);
  EXPECT_EQ(source_of(*be, c, 0, 12), 12);
  EXPECT_EQ(source_of(*be, c, 1, 14), 14);
  // Bad ranges.
  EXPECT_FALSE(c.shift(10, 6).ok());
  EXPECT_FALSE(c.shift(-1, 2).ok());
  EXPECT_FALSE(c.shift(2, 0).ok());
}

// K rows rotated at position p, shifted down by n and re-rotated by -n, against the same
// rows rotated directly at p - n and stored in the same type. Bounds: f32 — a few fp32
// roundings of values of magnitude <= 4 (the two rotations' cos/sin and products);
// f16 — the re-rotated row went through f16 twice (stored at p, rotated, stored again),
// the direct one once, and the first rounding is spread by the rotation: two fp16 steps
// of values below 4 (2 × 2^-9) each way; q8_0 / q4_0 —
// the row is requantized, so each value may move by up to one quantization step of its
// block (max|x| / 127, max|x| / 8), two with the direct row's own rounding.
void check_rerotate(KvDtype type, RopeStyle style, float tol_f32_steps) {
  constexpr int Hkv = 2, D = 64, P = 40, first = 6, n = 15;
  auto be = make_cpu_backend(1);
  KvCacheConfig cfg = kv_config_full({1, Hkv, D}, {type, KvDtype::F32});
  auto made = be->create_kv_cache(cfg, P);
  ASSERT_TRUE(made.ok()) << made.error().message;
  auto& c = static_cast<cpu::CpuKvCache&>(**made);
  const RopeSpec rope{style, D, 10000.0f, 1.0f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> raw(size_t(P) * Hkv * D);
  for (float& f : raw) f = u(rng);
  auto k = be->scratch(0, P, Hkv * D);
  auto v = be->scratch(1, P, Hkv * D);
  auto q = be->scratch(3, P, Hkv * D);
  ASSERT_TRUE(k.ok() && v.ok() && q.ok());
  std::copy(raw.begin(), raw.end(), k->data);
  std::fill(v->data, v->data + v->size(), 0.0f);
  std::fill(q->data, q->data + q->size(), 0.0f);
  ASSERT_TRUE(c.begin(0, P).ok());
  ASSERT_TRUE(be->rope_kv_write(*q, *k, *v, c, 0, Hkv, rope, 0).ok());
  ASSERT_TRUE(c.end().ok());
  ASSERT_TRUE(c.shift(first, n).ok());
  ASSERT_TRUE(be->kv_rerotate(c, 0, rope, first, -n).ok());
  ASSERT_EQ(c.length(), P - n);

  // The direct rows: raw position p + n rotated at p, stored and loaded in `type`.
  auto direct = be->scratch(2, 1, Hkv * D);
  std::vector<float> got(D), want(D);
  std::vector<uint8_t> stored(size_t(kv_row_bytes(type, D)));
  double worst = 0;
  for (int p = 0; p < P - n; ++p) {
    const int src = p < first ? p : p + n;
    std::copy(raw.begin() + int64_t(src) * Hkv * D, raw.begin() + int64_t(src + 1) * Hkv * D,
              direct->data);
    ASSERT_TRUE(be->rope(*direct, Hkv, D, rope, p).ok());
    for (int h = 0; h < Hkv; ++h) {
      cpu::store_row(type, direct->data + h * D, stored.data(), D);
      cpu::load_row(type, stored.data(), want.data(), D);
      cpu::load_row(type, c.k_row(0, h, c.slot_of(0, p)), got.data(), D);
      for (int b = 0; b < D; b += 32) {
        float amax = 0;
        for (int i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(direct->data[h * D + i]));
        const float step = type == KvDtype::Q8_0   ? amax / 127.0f
                           : type == KvDtype::Q4_0 ? amax / 8.0f
                           : type == KvDtype::F16  ? 2.0f / 512.0f
                                                   : 0.0f;
        const float tol = 2.0f * step + tol_f32_steps * 4.0f * 1.2e-7f;
        for (int i = b; i < b + 32; ++i) {
          ASSERT_NEAR(got[size_t(i)], want[size_t(i)], tol)
              << kv_dtype_name(type) << " position " << p << " head " << h << " dim " << i;
          worst = std::max(worst, double(std::fabs(got[size_t(i)] - want[size_t(i)])));
        }
      }
    }
  }
  std::printf("%s %s: largest difference re-rotated vs direct %.3g\n", kv_dtype_name(type),
              style == RopeStyle::NeoX ? "neox" : "adjacent", worst);
}

TEST(KvShift, RerotatedRowsEqualRowsRotatedAtTheNewPosition) {
  for (RopeStyle style : {RopeStyle::Adjacent, RopeStyle::NeoX}) {
    check_rerotate(KvDtype::F32, style, 8);
    check_rerotate(KvDtype::F16, style, 8);
    check_rerotate(KvDtype::Q8_0, style, 8);
    check_rerotate(KvDtype::Q4_0, style, 8);
  }
}

// --- Sessions whose context fills up.

struct Run {
  std::vector<StepTrace> steps;
  std::vector<int32_t> tokens, history;
  std::vector<float> logits;
};

Expected<Run> run(std::shared_ptr<const Model> model, CacheMode mode, int ctx, int n_keep,
                  const std::vector<int32_t>& prompt, int steps, KvTypes types = {},
                  std::vector<int> switch_at = {}) {
  SessionConfig c;
  c.mode = mode;
  c.kv_types = types;
  c.limits.n_ctx = ctx;
  c.limits.on_full = ContextPolicy::Shift;
  c.limits.n_keep = n_keep;
  c.max_tokens = steps;
  c.stop_at_eos = false;
  c.top_candidates = 1;
  auto s = Session::create(model, make_cpu_backend(2), c);
  if (!s.ok()) return s.error();
  KV_TRY((*s)->reset_tokens(prompt));
  Run r;
  for (int i = 0; i < steps; ++i) {
    if (std::find(switch_at.begin(), switch_at.end(), i) != switch_at.end())
      KV_TRY(
          (*s)->set_mode((*s)->mode() == CacheMode::Cache ? CacheMode::NoCache : CacheMode::Cache));
    auto tr = (*s)->step();
    if (!tr.ok()) return tr.error();
    r.steps.push_back(std::move(tr.value()));
  }
  r.tokens = (*s)->tokens();
  r.history = (*s)->history();
  r.logits = (*s)->last_logits();
  return r;
}

// What a run's traces must show: a shift exactly when the sequence is full, of the
// oldest half after n_keep; the tokens kept are the history without the dropped ranges;
// the cache holds every position of the sequence and never more than the context.
void check_shifts(const Run& r, const Model& m, int ctx, int n_keep, int prompt_len, bool cached) {
  const ModelConfig& c = m.config();
  std::vector<int32_t> seq(r.history.begin(), r.history.begin() + prompt_len);
  int shifts = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepTrace& t = r.steps[i];
    if (int(seq.size()) >= ctx) {
      ASSERT_EQ(t.shift_first, n_keep) << "step " << t.step;
      ASSERT_EQ(t.shift_n, (ctx - n_keep) / 2) << "step " << t.step;
      seq.erase(seq.begin() + n_keep, seq.begin() + n_keep + t.shift_n);
      ++shifts;
    } else {
      ASSERT_EQ(t.shift_n, 0) << "step " << t.step;
    }
    ASSERT_EQ(t.pos, int(seq.size()));
    ASSERT_EQ(t.n_attn, int(seq.size()));
    seq.push_back(t.token_id);
    ASSERT_EQ(t.seq_len, int(seq.size()));
    ASSERT_LE(t.seq_len, ctx);
    if (cached) {
      EXPECT_LE(t.kv_bytes, uint64_t(ctx) * c.n_layer *
                                kv_position_bytes({c.n_layer, c.n_head_kv, c.head_dim}, {}));
      // Every position a later query can see, in one run; a windowed layer holds from
      // inside the block of the oldest key it sees (rows moved down by a shift may leave
      // the start of that block empty).
      for (int l = 0; l < c.n_layer; ++l) {
        const int w = c.layers[size_t(l)].window;
        const int seen = w > 0 ? std::max(0, t.pos - w + 1) : 0;
        const auto& held = t.kv_layers[size_t(l)].held;
        ASSERT_EQ(held.size(), 1u) << "step " << t.step << " layer " << l;
        EXPECT_EQ(held[0].end, t.pos) << "step " << t.step << " layer " << l;
        EXPECT_LE(held[0].begin, seen) << "step " << t.step << " layer " << l;
        EXPECT_GE(held[0].begin, seen / 16 * 16) << "step " << t.step << " layer " << l;
      }
    }
  }
  EXPECT_EQ(r.tokens, seq);
  EXPECT_GE(shifts, 2);
  EXPECT_EQ(int(r.history.size()), prompt_len + int(r.steps.size()));
}

float largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

class KvShiftModel : public ModelTest<DefaultModelFile> {
 protected:
  static std::vector<int32_t> prompt() {
    auto ids =
        model_->tokenizer().encode("The old lighthouse keeper climbed the stairs and", false);
    EXPECT_TRUE(ids.ok());
    return *ids;
  }
};

TEST_F(KvShiftModel, KeepsTheFirstTokensDropsTheOldestHalfAndAgreesWithNoCache) {
  constexpr int ctx = 32, n_keep = 4, steps = 48;
  const auto p = prompt();
  auto a = run(model_, CacheMode::Cache, ctx, n_keep, p, steps);
  auto b = run(model_, CacheMode::NoCache, ctx, n_keep, p, steps);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  check_shifts(*a, *model_, ctx, n_keep, int(p.size()), true);
  check_shifts(*b, *model_, ctx, n_keep, int(p.size()), false);
  EXPECT_EQ(a->history, b->history);  // the same tokens, step by step
  // Same arithmetic per token whatever the batch: the logits agree to within 1e-3.
  EXPECT_LT(largest_difference(a->logits, b->logits), 1e-3f);
  // A cache rebuilt after two mode switches replays the shifts: still the same tokens.
  auto c = run(model_, CacheMode::Cache, ctx, n_keep, p, steps, {}, {24, 40});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->history, a->history);
}

TEST_F(KvShiftModel, QuantizedCacheShiftsToo) {
  constexpr int ctx = 32, n_keep = 1, steps = 48;
  const auto p = prompt();
  const KvTypes q8{KvDtype::Q8_0, KvDtype::Q8_0};
  auto a = run(model_, CacheMode::Cache, ctx, n_keep, p, steps, q8);
  auto b = run(model_, CacheMode::NoCache, ctx, n_keep, p, steps, q8);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  check_shifts(*a, *model_, ctx, n_keep, int(p.size()), true);
  EXPECT_EQ(a->history, b->history);
}

// Gemma 3's sliding-window layers are rings of their last W positions: a shift moves
// what they hold, and both modes agree.
Expected<std::shared_ptr<Model>> tiny_gemma3() {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvscope_shift_" + std::to_string(getpid()) + ".gguf"))
                               .string();
  if (Status s = test::write_tiny_model(test::tiny_family("gemma3", 31), path); !s.ok())
    return s.error();
  auto m = Model::load(path);
  std::filesystem::remove(path);  // the mapping stays valid after unlinking
  return m;
}

TEST(KvShiftGemma, WindowedRingsShiftAndAgreeWithNoCache) {
  auto m = tiny_gemma3();
  ASSERT_TRUE(m.ok()) << m.error().message;
  const int window = (*m)->config().layers[0].window;
  constexpr int ctx = 16, steps = 40;
  ASSERT_GT(window, 0);
  ASSERT_LT(window, ctx);
  const std::vector<int32_t> prompt{5, 70, 71, 72, 40, 41};
  auto a = run(*m, CacheMode::Cache, ctx, 0, prompt, steps);
  auto b = run(*m, CacheMode::NoCache, ctx, 0, prompt, steps);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  check_shifts(*a, **m, ctx, 0, int(prompt.size()), true);
  EXPECT_EQ(a->history, b->history);
  EXPECT_LT(largest_difference(a->logits, b->logits), 1e-3f);
  // Kept positions that the windowed layers have already evicted cannot be kept.
  SessionConfig c;
  c.limits.n_ctx = ctx;
  c.limits.on_full = ContextPolicy::Shift;
  c.limits.n_keep = 2;
  auto bad = Session::create(*m, make_cpu_backend(1), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("n-keep"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace kvscope
