// test_backend_ops.cpp — every Backend op, one backend against another, over small grids of
// shapes and types (the idea of llama.cpp's test-backend-ops).
//
// The reference is the CPU backend; the backend under test is the CUDA backend: under the
// emulator in test_backend_ops, on the GPU in test_backend_ops_gpu (which skips without
// one). A pair of sides (backend + how host data gets into its tensors) is the parameter
// of run_parity(), so another pair only needs two more Sides.
//
// The table (op_table()) has one entry per op of the interface (kBackendOps in
// engine/backend.h): the op's name, its tolerance |got - want| <= abs + rel * |want|, the
// cases (each runs the op on a side and returns named host outputs, which must agree
// within the tolerance) and the bad calls (each must fail with the same message on both
// sides, starting "<op>: "). An op joins by adding one entry; the tests below fail while
// an op of kBackendOps has none, and this file does not build while its probe backend
// misses a new do_<op> of Backend.
//
// Inputs are random (fixed seeds). Weights of every type both backends decode; KV caches
// of every cache type (f32, f16, q8_0, q4_0); windows with sinks for attention.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/kv_cache.h"
#include "engine/quant.h"
#include "kernels/kernels.h"
#include "tests/kernels/cuda_parity_util.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/quant_test_util.h"

namespace kvscope {
namespace {

using kvscope::test::random_floats;
using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;
using Shapes = std::vector<std::pair<int, int>>;  // rows x cols

// A failed op inside a case: the case stops and reports the message.
struct OpFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void ok(const Status& s) {
  if (!s.ok()) throw OpFailed(s.message());
}
template <class T>
T ok(Expected<T> e) {
  if (!e.ok()) throw OpFailed(e.error().message);
  return std::move(e.value());
}

// --- Host data shared by both sides ---------------------------------------------------

// The bytes of every weight made here stay alive for the whole run: the CUDA backend
// keys its uploads by the weight's data pointer, which must never point at new contents.
std::deque<std::vector<uint8_t>>& arena() {
  static std::deque<std::vector<uint8_t>> a;
  return a;
}

Weight make_weight(GgmlType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  auto m = kvscope::test::random_matrix(type, n_in, n_out, seed);
  arena().push_back(std::move(m.bytes));
  Weight w;
  w.name = "w_" + ggml_type_name(type);
  w.type = type;
  w.n_in = n_in;
  w.n_out = n_out;
  w.data = arena().back().data();
  w.row_bytes = row_bytes(type, uint64_t(n_in));
  return w;
}

// An f32 vector weight (norm or bias) of n values in [lo, hi).
Weight make_vector(int64_t n, uint32_t seed, float lo = 0.5f, float hi = 1.5f) {
  const auto f = random_floats(size_t(n), seed, lo, hi);
  arena().emplace_back(f.size() * sizeof(float));
  std::memcpy(arena().back().data(), f.data(), f.size() * sizeof(float));
  Weight w;
  w.name = "vec";
  w.type = GgmlType::F32;
  w.n_in = n;
  w.n_out = 1;
  w.data = arena().back().data();
  w.row_bytes = uint64_t(n) * 4;
  return w;
}

// --- One side of a comparison -----------------------------------------------------------

struct Side {
  std::string label;
  Backend* be = nullptr;
  // Copies rows*cols floats from the host into t (backend memory).
  std::function<Status(Tensor, const float*)> upload;

  // Scratch slot `slot` as rows x cols, holding `data` (when not empty).
  Tensor put(int slot, int64_t rows, int64_t cols, const std::vector<float>& data = {}) {
    Tensor t = ok(be->scratch(slot, rows, cols));
    if (!data.empty()) {
      if (int64_t(data.size()) != rows * cols) throw OpFailed("test: data size mismatch");
      ok(upload(t, data.data()));
    }
    return t;
  }
  std::vector<float> get(Tensor t) {
    std::vector<float> h(size_t(t.size()));
    ok(be->download(t, h.data()));
    return h;
  }
  std::unique_ptr<KvCache> cache(const KvCacheConfig& cfg, int capacity = 8) {
    return ok(be->create_kv_cache(cfg, capacity));
  }
  // Positions [length, length + n) of every layer written with random rows (seeded by
  // position and layer, so both sides store the same values).
  void fill(KvCache& c, int n, uint32_t seed, int slot = 40) {
    const KvShape& s = c.shape();
    const int pos0 = c.length();
    const int64_t W = int64_t(s.n_head_kv) * s.head_dim;
    ok(c.begin(pos0, n));
    for (int l = 0; l < s.n_layer; ++l) {
      Tensor k = put(slot, n, W, random_floats(size_t(n * W), seed + 1000 * l + pos0));
      Tensor v = put(slot + 1, n, W, random_floats(size_t(n * W), seed + 1000 * l + pos0 + 7));
      ok(be->kv_write(c, l, k, v, pos0));
    }
    ok(c.end());
  }
};

Side cpu_side(Backend& be) {
  return Side{"cpu", &be, [](Tensor t, const float* h) {
                std::memcpy(t.data, h, size_t(t.size()) * sizeof(float));
                return Status::Ok();
              }};
}

Side cuda_side(Backend& be) {
  return Side{"cuda", &be, [](Tensor t, const float* h) {
                // The backend's stream and this copy's legacy stream do not wait for each
                // other, and a copy from pageable memory may return before its DMA lands:
                // the device-wide waits keep the backend's queued kernels from reading the
                // slot's next contents (the K/V rows of the next layer, seen on an H200 as
                // an attention case failing under load) and its next reads from seeing
                // the previous contents (a real GPU read the previous case's data back).
                if (cudaDeviceSynchronize() != cudaSuccess ||
                    cudaMemcpy(t.data, h, size_t(t.size()) * sizeof(float),
                               cudaMemcpyHostToDevice) != cudaSuccess ||
                    cudaDeviceSynchronize() != cudaSuccess)
                  return Status(make_error("test: upload failed"));
                return Status::Ok();
              }};
}

// --- The table ---------------------------------------------------------------------------

struct Tol {
  float abs = 0, rel = 0;
};
struct Case {
  std::string name;
  std::function<Outputs(Side&)> run;
};
struct BadCall {
  std::string name;
  std::function<Status(Side&)> run;
};
struct OpEntry {
  const char* op;
  Tol tol;
  std::vector<Case> cases;
  std::vector<BadCall> bad;
};

const char* dtype_name(KvDtype t) { return kv_dtype_name(t); }

constexpr KvDtype kKvTypes[] = {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0};

// Every weight type both backends decode.
std::vector<GgmlType> matmul_types() {
  std::vector<GgmlType> out;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0,
                     GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    if (type_supported(t) && kvscope::cuda::qtype_supported(int(t))) out.push_back(t);
  return out;
}

KvCacheConfig kv_cfg(int L, int Hkv, int D, KvDtype k, KvDtype v, int window = 0, int sink = 0) {
  KvCacheConfig c = kv_config_full(KvShape{L, Hkv, D}, KvTypes{k, v});
  for (auto& r : c.layers) {
    r.window = window;
    r.sink = sink;
  }
  return c;
}

std::string shape_name(int64_t a, int64_t b) {
  return std::to_string(a) + "x" + std::to_string(b);
}

// The rows ops' caches: one per sequence, filled with `lengths[b]` random positions; paged
// over one pool of 8-position blocks where the side's backend has pools (the probe has
// none: plain caches there). pos[b] = lengths[b], the next position.
struct RowsKit {
  std::shared_ptr<KvPool> pool;
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<KvCache*> ptrs;
  std::vector<int> pos;
  DecodeRows rows() const { return DecodeRows{ptrs.data(), pos.data(), int(ptrs.size())}; }
};
RowsKit rows_kit(Side& s, const KvCacheConfig& cfg, const std::vector<int>& lengths,
                 uint32_t seed) {
  RowsKit k;
  auto pool = s.be->create_kv_pool(KvPoolConfig{cfg.shape, cfg.types, 8, 32});
  if (pool.ok()) k.pool = *pool;
  for (size_t b = 0; b < lengths.size(); ++b) {
    k.caches.push_back(k.pool ? ok(s.be->create_paged_kv_cache(cfg, k.pool)) : s.cache(cfg));
    s.fill(*k.caches.back(), lengths[b], seed + 37 * uint32_t(b));
    k.ptrs.push_back(k.caches.back().get());
    k.pos.push_back(lengths[b]);
  }
  return k;
}

// Bad calls share a small set of tensors and a cache: 2 layers, 2 kv heads of 32.
struct BadKit {
  Tensor x4x64, x4x7, q4x128, k4x64, v4x64, row1x4;
  Weight w64x40, vec64;
  std::unique_ptr<KvCache> cache;
};
BadKit bad_kit(Side& s) {
  static const Weight w = make_weight(GgmlType::Q8_0, 64, 40, 900);
  static const Weight vec = make_vector(64, 901);
  BadKit k;
  k.x4x64 = s.put(0, 4, 64, random_floats(256, 1));
  k.x4x7 = s.put(1, 4, 7, random_floats(28, 2));
  k.q4x128 = s.put(2, 4, 128, random_floats(512, 3));
  k.k4x64 = s.put(3, 4, 64, random_floats(256, 4));
  k.v4x64 = s.put(4, 4, 64, random_floats(256, 5));
  k.row1x4 = s.put(5, 1, 4);
  k.w64x40 = w;
  k.vec64 = vec;
  k.cache = s.cache(kv_cfg(2, 2, 32, KvDtype::F16, KvDtype::F16));
  s.fill(*k.cache, 4, 77);
  return k;
}

// The fused layer halves (norm_qkv_kv_write, norm_ffn): the one-launch CUDA form (one row,
// Q4_1 / Q8_0 weights) and the unfused composition (several rows, another weight type),
// with and without the previous product, its post norm, biases and q/k norms.
struct FusedVariant {
  const char* name;
  int T;
  bool y, y_norm, bias, qk_norm;
  GgmlType type;
};
constexpr FusedVariant kFusedVariants[] = {
    {"decode", 1, true, false, false, false, GgmlType::Q4_1},
    {"first layer", 1, false, false, false, false, GgmlType::Q8_0},
    {"gemma", 1, true, true, false, true, GgmlType::Q8_0},
    {"qwen", 1, true, false, true, false, GgmlType::Q4_1},
    {"prompt", 3, true, true, true, true, GgmlType::Q4_1},
    {"f16 weights", 1, true, false, false, false, GgmlType::F16},
};

void add_fused_layer_entries(std::vector<OpEntry>& t) {
  const RopeSpec neox{RopeStyle::NeoX, 32, 10000.f, 1.f};
  constexpr int C = 64, H = 4, Hkv = 2, D = 32, F = 96, pos0 = 5;
  {
    OpEntry e{"norm_qkv_kv_write", {2e-4f, 1e-3f}, {}, {}};
    for (const FusedVariant& fv : kFusedVariants)
      for (KvDtype kt : kKvTypes) {
        if (fv.T != 1 && kt != KvDtype::F16) continue;
        if (std::string(fv.name) != "decode" && kt != KvDtype::F16) continue;
        const Weight wq = make_weight(fv.type, C, H * D, 300), wk = make_weight(fv.type, C, Hkv * D, 301),
                     wv = make_weight(fv.type, C, Hkv * D, 302);
        const Weight attn_norm = make_vector(C, 303), y_norm = make_vector(C, 304);
        const Weight bq = make_vector(H * D, 305, -1, 1), bk = make_vector(Hkv * D, 306, -1, 1),
                     bv = make_vector(Hkv * D, 307, -1, 1);
        const Weight q_norm = make_vector(D, 308), k_norm = make_vector(D, 309);
        e.cases.push_back(
            {std::string(fv.name) + " " + dtype_name(kt), [=](Side& s) {
               const int T = fv.T;
               auto c = s.cache(kv_cfg(2, Hkv, D, kt, kt));
               s.fill(*c, pos0, 310);
               Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 311, -3, 3));
               Tensor y = fv.y ? s.put(1, T, C, random_floats(size_t(T * C), 312)) : Tensor{};
               Tensor h = s.put(2, T, C);
               QkvStore a;
               a.wq = &wq;
               a.wk = &wk;
               a.wv = &wv;
               if (fv.bias) {
                 a.bq = &bq;
                 a.bk = &bk;
                 a.bv = &bv;
               }
               if (fv.qk_norm) {
                 a.q_norm = &q_norm;
                 a.k_norm = &k_norm;
               }
               a.q = s.put(3, T, H * D);
               a.k = s.put(4, T, Hkv * D);
               a.v = s.put(5, T, Hkv * D);
               a.cache = c.get();
               a.layer = 1;
               a.n_head = H;
               a.rope = neox;
               a.pos0 = pos0;
               Tensor norms = s.put(6, 2, T);
               a.k_row_norm = norms.row(0);
               a.v_row_norm = norms.row(1);
               ok(c->begin(pos0, T));
               ok(s.be->norm_qkv_kv_write(
                   ResidualNorm{x, y, fv.y_norm ? &y_norm : nullptr, &attn_norm, 1e-6f, h}, a));
               ok(c->end());
               Outputs o{{"x", s.get(x)}, {"h", s.get(h)}, {"q", s.get(a.q)},
                         {"k", s.get(a.k)}, {"v", s.get(a.v)}};
               // What was stored, where a rounding flip of the cache type cannot show: the
               // rows' norms and attention over the cache.
               if (kt == KvDtype::F32 || kt == KvDtype::F16) {
                 Tensor att = s.put(7, T, H * D);
                 ok(s.be->attention(a.q, *c, 1, pos0, H, 0.2f, att, Tensor{}));
                 o.push_back({"norms", s.get(norms)});
                 o.push_back({"attention", s.get(att)});
               }
               return o;
             }});
      }
    e.bad.push_back({"h on x", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       QkvStore a;
                       a.wq = a.wk = a.wv = &k.w64x40;
                       a.q = k.q4x128;
                       a.k = k.k4x64;
                       a.v = k.v4x64;
                       a.cache = k.cache.get();
                       a.n_head = 4;
                       a.rope = neox;
                       return s.be->norm_qkv_kv_write(
                           ResidualNorm{k.x4x64, Tensor{}, nullptr, &k.vec64, 1e-6f, k.x4x64}, a);
                     }});
    e.bad.push_back({"q width", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       QkvStore a;
                       a.wq = a.wk = a.wv = &k.w64x40;
                       a.q = k.q4x128;
                       a.k = k.k4x64;
                       a.v = k.v4x64;
                       a.cache = k.cache.get();
                       a.n_head = 4;
                       a.rope = neox;
                       return s.be->norm_qkv_kv_write(
                           ResidualNorm{k.x4x64, Tensor{}, nullptr, &k.vec64, 1e-6f, k.v4x64}, a);
                     }});
    t.push_back(std::move(e));
  }
  {
    OpEntry e{"norm_ffn", {2e-4f, 1e-3f}, {}, {}};
    for (const FusedVariant& fv : kFusedVariants)
      for (FfnAct act : {FfnAct::Silu, FfnAct::GeluTanh})
        for (bool out_is_y : {false, true}) {
          if (out_is_y && !fv.y) continue;
          const GgmlType down_type = fv.type == GgmlType::Q4_1 ? GgmlType::Q8_0 : fv.type;
          const Weight wg = make_weight(fv.type, C, F, 320), wu = make_weight(fv.type, C, F, 321),
                       wd = make_weight(down_type, F, C, 322);
          const Weight ffn_norm = make_vector(C, 323), y_norm = make_vector(C, 324);
          e.cases.push_back(
              {std::string(fv.name) + (act == FfnAct::Silu ? " silu" : " gelu") +
                   (out_is_y ? " out = y" : ""),
               [=](Side& s) {
                 const int T = fv.T;
                 Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 325, -3, 3));
                 Tensor y = fv.y ? s.put(1, T, C, random_floats(size_t(T * C), 326)) : Tensor{};
                 Tensor h = s.put(2, T, C), gate = s.put(3, T, F), up = s.put(4, T, F);
                 Tensor out = out_is_y ? y : s.put(5, T, C);
                 ok(s.be->norm_ffn(
                     ResidualNorm{x, y, fv.y_norm ? &y_norm : nullptr, &ffn_norm, 1e-6f, h},
                     FfnWeights{&wg, &wu, &wd, act}, gate, up, out));
                 return Outputs{{"x", s.get(x)}, {"h", s.get(h)}, {"out", s.get(out)}};
               }});
        }
    e.bad.push_back({"down shape", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor gate = s.put(6, 4, 40), up = s.put(7, 4, 40);
                       return s.be->norm_ffn(
                           ResidualNorm{k.x4x64, Tensor{}, nullptr, &k.vec64, 1e-6f, k.v4x64},
                           FfnWeights{&k.w64x40, &k.w64x40, &k.w64x40, FfnAct::Silu}, gate, up,
                           k.k4x64);
                     }});
    t.push_back(std::move(e));
  }
}

std::vector<OpEntry> op_table() {
  std::vector<OpEntry> t;
  const RopeSpec neox{RopeStyle::NeoX, 32, 10000.f, 1.f};

  // scratch: a slot of the asked shape that holds what is put in.
  {
    OpEntry e{"scratch", {0, 0}, {}, {}};
    for (auto [r, c] : Shapes{{1, 1}, {3, 64}, {17, 130}})
      e.cases.push_back({shape_name(r, c), [r = r, c = c](Side& s) {
                           Tensor t = s.put(7, r, c, random_floats(size_t(r * c), r + c));
                           return Outputs{{"shape", {float(t.rows), float(t.cols)}},
                                          {"data", s.get(t)}};
                         }});
    e.bad.push_back({"slot", [](Side& s) {
                       auto r = s.be->scratch(65, 1, 1);
                       return r.ok() ? Status::Ok() : Status(r.error());
                     }});
    e.bad.push_back({"rows", [](Side& s) {
                       auto r = s.be->scratch(0, -1, 4);
                       return r.ok() ? Status::Ok() : Status(r.error());
                     }});
    t.push_back(std::move(e));
  }

  // create_kv_cache: the layout of a new cache, for every cache type and a window.
  {
    OpEntry e{"create_kv_cache", {0, 0}, {}, {}};
    for (KvDtype kt : kKvTypes)
      for (int window : {0, 4})
        e.cases.push_back(
            {std::string(dtype_name(kt)) + " window " + std::to_string(window),
             [kt, window](Side& s) {
               auto c = s.cache(kv_cfg(2, 2, 32, kt, kt, window, window ? 1 : 0), 6);
               s.fill(*c, 3, 5);
               Outputs o;
               for (int l = 0; l < 2; ++l)
                 o.push_back({"layer " + std::to_string(l),
                              {float(c->n_slots(l)), float(c->held(l)),
                               float(c->layer_bytes(l)), float(c->length())}});
               return o;
             }});
    e.bad.push_back({"layers", [](Side& s) {
                       KvCacheConfig c = kv_cfg(2, 2, 32, KvDtype::F16, KvDtype::F16);
                       c.layers.pop_back();
                       auto r = s.be->create_kv_cache(c, 4);
                       return r.ok() ? Status::Ok() : Status(r.error());
                     }});
    e.bad.push_back({"head_dim", [](Side& s) {
                       auto r = s.be->create_kv_cache(kv_cfg(2, 2, 0, KvDtype::F16, KvDtype::F16), 4);
                       return r.ok() ? Status::Ok() : Status(r.error());
                     }});
    t.push_back(std::move(e));
  }

  // embed: every table type, T 1 and 3, scale 1 and 2.5.
  {
    OpEntry e{"embed", {1e-6f, 1e-6f}, {}, {}};
    for (GgmlType ty : matmul_types())
      for (int T : {1, 3})
        for (float scale : {1.0f, 2.5f}) {
          const int64_t C = type_traits(ty)->block_size == 256 ? 256 : 64;
          const Weight table = make_weight(ty, C, 50, 10 + int(ty));
          e.cases.push_back({ggml_type_name(ty) + " T" + std::to_string(T) + " scale " +
                                 std::to_string(scale),
                             [=](Side& s) {
                               const int32_t ids[3] = {7, 0, 49};
                               Tensor out = s.put(0, T, C);
                               ok(s.be->embed(table, ids, scale, out));
                               return Outputs{{"out", s.get(out)}};
                             }});
        }
    e.bad.push_back({"id", [](Side& s) {
                       BadKit k = bad_kit(s);
                       static const Weight table = make_weight(GgmlType::F16, 64, 50, 902);
                       const int32_t ids[4] = {1, 2, 50, 3};
                       return s.be->embed(table, ids, 1.0f, k.x4x64);
                     }});
    e.bad.push_back({"width", [](Side& s) {
                       BadKit k = bad_kit(s);
                       static const Weight table = make_weight(GgmlType::F16, 64, 50, 902);
                       const int32_t ids[4] = {1, 2, 3, 4};
                       return s.be->embed(table, ids, 1.0f, k.x4x7);
                     }});
    e.bad.push_back({"null ids", [](Side& s) {
                       BadKit k = bad_kit(s);
                       static const Weight table = make_weight(GgmlType::F16, 64, 50, 902);
                       return s.be->embed(table, nullptr, 1.0f, k.x4x64);
                     }});
    t.push_back(std::move(e));
  }

  // rmsnorm: T x C, in place and not; per-head rows ([T*H][D]).
  {
    OpEntry e{"rmsnorm", {1e-5f, 1e-5f}, {}, {}};
    for (auto [T, C] : Shapes{{1, 64}, {5, 96}, {12, 24}})
      for (bool in_place : {false, true}) {
        const Weight w = make_vector(C, 20 + C);
        e.cases.push_back({shape_name(T, C) + (in_place ? " in place" : ""),
                           [=, T = T, C = C](Side& s) {
                             Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 21, -3, 3));
                             Tensor out = in_place ? x : s.put(1, T, C);
                             ok(s.be->rmsnorm(x, w, 1e-6f, out));
                             return Outputs{{"out", s.get(out)}};
                           }});
      }
    e.bad.push_back({"weight", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rmsnorm(k.x4x7, k.vec64, 1e-6f, k.x4x7);
                     }});
    e.bad.push_back({"out", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rmsnorm(k.x4x64, k.vec64, 1e-6f, k.k4x64.row_range(0, 2));
                     }});
    e.bad.push_back({"type", [](Side& s) {
                       BadKit k = bad_kit(s);
                       static const Weight w16 = make_weight(GgmlType::F16, 64, 1, 903);
                       return s.be->rmsnorm(k.x4x64, w16, 1e-6f, k.x4x64);
                     }});
    t.push_back(std::move(e));
  }

  // matmul: every weight type; T 1 and 3 (matvec kernels) and 9 (cuBLAS on the GPU);
  // n_in 256 (and 96 for the 32-value block types). Both sides sum fp32 products, in
  // different orders: the tolerance is relative to values that reach ~1e3 (K-quant
  // blocks of random bytes).
  {
    OpEntry e{"matmul", {1e-3f, 1e-4f}, {}, {}};
    for (GgmlType ty : matmul_types()) {
      const bool k_quant = type_traits(ty)->block_size == 256;
      for (int64_t n_in : {int64_t(256), int64_t(96)}) {
        if (k_quant && n_in % 256 != 0) continue;
        const Weight w = make_weight(ty, n_in, 67, 30 + int(ty) + int(n_in));
        for (int T : {1, 3, 9})
          e.cases.push_back({ggml_type_name(ty) + " " + shape_name(67, n_in) + " T" +
                                 std::to_string(T),
                             [=](Side& s) {
                               Tensor x = s.put(0, T, n_in,
                                                random_floats(size_t(T * n_in), 31 + T));
                               Tensor out = s.put(1, T, 67);
                               ok(s.be->matmul(w, x, out));
                               return Outputs{{"out", s.get(out)}};
                             }});
      }
    }
    e.bad.push_back({"x.cols", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->matmul(k.w64x40, k.x4x7, k.q4x128);
                     }});
    e.bad.push_back({"out.cols", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->matmul(k.w64x40, k.x4x64, k.q4x128);
                     }});
    e.bad.push_back({"out.rows", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor out = s.put(6, 3, 40);
                       return s.be->matmul(k.w64x40, k.x4x64, out);
                     }});
    e.bad.push_back({"no rows", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->matmul(k.w64x40, k.x4x64.row_range(0, 0),
                                           k.q4x128.row_range(0, 0));
                     }});
    t.push_back(std::move(e));
  }

  // add_bias
  {
    OpEntry e{"add_bias", {1e-6f, 1e-6f}, {}, {}};
    for (auto [T, C] : Shapes{{1, 64}, {4, 96}}) {
      const Weight b = make_vector(C, 40 + C, -1, 1);
      e.cases.push_back({shape_name(T, C), [=, T = T, C = C](Side& s) {
                           Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 41));
                           ok(s.be->add_bias(x, b));
                           return Outputs{{"x", s.get(x)}};
                         }});
    }
    e.bad.push_back({"width", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->add_bias(k.x4x7, k.vec64);
                     }});
    t.push_back(std::move(e));
  }

  // rope: both pairings, full and partial rotation, two head dims, positions 0, 37 and
  // -5 (backwards), a position scale.
  {
    OpEntry e{"rope", {2e-5f, 2e-5f}, {}, {}};
    for (RopeStyle st : {RopeStyle::Adjacent, RopeStyle::NeoX})
      for (int D : {16, 24})
        for (int n_rot : {D, D / 2})
          for (int pos0 : {0, 37, -5})
            for (float fs : {1.0f, 0.25f}) {
              if (fs != 1.0f && (pos0 != 37 || D != 16)) continue;
              if (pos0 < 0 && n_rot != D) continue;
              const int H = 4, T = 3;
              const RopeSpec r{st, n_rot, 10000.f, fs};
              e.cases.push_back(
                  {std::string(st == RopeStyle::NeoX ? "neox" : "adjacent") + " D" +
                       std::to_string(D) + " n_rot " + std::to_string(n_rot) + " pos0 " +
                       std::to_string(pos0) + " scale " + std::to_string(fs),
                   [=](Side& s) {
                     Tensor x = s.put(0, T, H * D, random_floats(size_t(T * H * D), 50 + D));
                     ok(s.be->rope(x, H, D, r, pos0));
                     return Outputs{{"x", s.get(x)}};
                   }});
            }
    e.bad.push_back({"heads", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rope(k.x4x64, 3, 32, neox, 0);
                     }});
    e.bad.push_back({"n_rot odd", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rope(k.x4x64, 2, 32, RopeSpec{RopeStyle::NeoX, 7}, 0);
                     }});
    e.bad.push_back({"n_rot wide", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rope(k.x4x64, 2, 32, RopeSpec{RopeStyle::NeoX, 34}, 0);
                     }});
    e.bad.push_back({"head_dim", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rope(k.x4x64, 64, 0, neox, 0);
                     }});
    t.push_back(std::move(e));
  }

  // kv_write: every K/V type pair with K = V and two mixed ones, 1 and 2 kv heads; the
  // stored rows read back through kv_row_errors (exactly a function of the stored bytes)
  // and kv_row_norms.
  {
    OpEntry e{"kv_write", {1e-5f, 1e-4f}, {}, {}};
    std::vector<std::pair<KvDtype, KvDtype>> types;
    for (KvDtype d : kKvTypes) types.push_back({d, d});
    types.push_back({KvDtype::Q8_0, KvDtype::F16});
    types.push_back({KvDtype::F16, KvDtype::Q4_0});
    for (auto [kt, vt] : types)
      for (int Hkv : {1, 2})
        e.cases.push_back(
            {std::string("k ") + dtype_name(kt) + " v " + dtype_name(vt) + " Hkv" +
                 std::to_string(Hkv),
             [kt = kt, vt = vt, Hkv](Side& s) {
               const int D = 32, W = Hkv * D;
               auto c = s.cache(kv_cfg(1, Hkv, D, kt, vt));
               s.fill(*c, 3, 60);  // positions 0..2, then 3..7 from k, v below
               const int T = 5, pos0 = 3;
               Tensor k = s.put(0, T, W, random_floats(size_t(T * W), 61, -2, 2));
               Tensor v = s.put(1, T, W, random_floats(size_t(T * W), 62, -2, 2));
               ok(c->begin(pos0, T));
               ok(s.be->kv_write(*c, 0, k, v, pos0));
               ok(c->end());
               Tensor err = s.put(2, 2, T), norm = s.put(3, 2, T);
               ok(s.be->kv_row_errors(*c, 0, pos0, k, v, err.row(0), err.row(1)));
               ok(s.be->kv_row_norms(*c, 0, pos0, T, norm.row(0), norm.row(1)));
               return Outputs{{"errors", s.get(err)}, {"norms", s.get(norm)}};
             }});
    e.bad.push_back({"layer", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_write(*k.cache, 2, k.k4x64, k.v4x64, 0);
                     }});
    e.bad.push_back({"width", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_write(*k.cache, 0, k.q4x128, k.v4x64, 0);
                     }});
    e.bad.push_back({"v rows", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_write(*k.cache, 0, k.k4x64, k.v4x64.row_range(0, 3), 0);
                     }});
    e.bad.push_back({"no room", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_write(*k.cache, 0, k.k4x64, k.v4x64, 2);
                     }});
    t.push_back(std::move(e));
  }

  // attention: every cache type; 4 query heads over 2 or 1 kv heads; a decode row and a
  // 4-row block after 6 cached positions; all keys or a window of 4 with a sink.
  {
    OpEntry e{"attention", {2e-4f, 2e-3f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      for (int Hkv : {2, 1})
        for (int T : {1, 4})
          for (int window : {0, 4}) {
            if (Hkv == 1 && window != 0) continue;
            e.cases.push_back(
                {std::string(dtype_name(kt)) + " H4/" + std::to_string(Hkv) + " T" +
                     std::to_string(T) + " window " + std::to_string(window),
                 [=](Side& s) {
                   const int H = 4, D = 32, pos0 = 6;
                   auto c = s.cache(kv_cfg(2, Hkv, D, kt, kt, window, window ? 1 : 0));
                   s.fill(*c, pos0, 70);
                   s.fill(*c, T, 71);
                   Tensor q = s.put(0, T, H * D, random_floats(size_t(T * H * D), 72, -2, 2));
                   Tensor out = s.put(1, T, H * D);
                   Tensor probs = s.put(2, H, pos0 + T);
                   ok(s.be->attention(q, *c, 1, pos0, H, 0.17677669f, out, probs));
                   return Outputs{{"out", s.get(out)}, {"probs", s.get(probs)}};
                 }});
          }
    // A decode row with more heads than the backend's model (16 > 4): the split kernel's
    // per-head merge counters grow to fit, twice in a row.
    e.cases.push_back({"f16 H16/2 T1 twice", [](Side& s) {
                         const int H = 16, D = 32, pos0 = 40;
                         auto c = s.cache(kv_cfg(2, 2, D, KvDtype::F16, KvDtype::F16), 48);
                         s.fill(*c, pos0 + 1, 73);
                         Outputs o;
                         for (int i = 0; i < 2; ++i) {
                           Tensor q = s.put(0, 1, H * D, random_floats(size_t(H * D), 74 + i));
                           Tensor out = s.put(1, 1, H * D);
                           ok(s.be->attention(q, *c, 0, pos0, H, 0.2f, out, Tensor{}));
                           o.push_back({"out " + std::to_string(i), s.get(out)});
                         }
                         return o;
                       }});
    e.bad.push_back({"groups", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->attention(k.q4x128, *k.cache, 0, 0, 3, 1.f, k.q4x128, {});
                     }});
    e.bad.push_back({"q width", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->attention(k.q4x128, *k.cache, 0, 0, 2, 1.f, k.q4x128, {});
                     }});
    e.bad.push_back({"probs", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor p = s.put(6, 4, 3);
                       return s.be->attention(k.q4x128, *k.cache, 0, 0, 4, 1.f, k.q4x128, p);
                     }});
    e.bad.push_back({"layer", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->attention(k.q4x128, *k.cache, -1, 0, 4, 1.f, k.q4x128, {});
                     }});
    e.bad.push_back({"not held", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->attention(k.q4x128, *k.cache, 0, 3, 4, 1.f, k.q4x128, {});
                     }});
    t.push_back(std::move(e));
  }

  // glu: both activations, in place and not.
  {
    OpEntry e{"glu", {1e-5f, 1e-5f}, {}, {}};
    for (FfnAct act : {FfnAct::Silu, FfnAct::GeluTanh})
      for (auto [T, F] : Shapes{{1, 96}, {3, 200}})
        for (bool in_place : {false, true})
          e.cases.push_back({std::string(act == FfnAct::Silu ? "silu " : "gelu_tanh ") +
                                 shape_name(T, F) + (in_place ? " in place" : ""),
                             [=, T = T, F = F](Side& s) {
                               Tensor g = s.put(0, T, F, random_floats(size_t(T * F), 80, -6, 6));
                               Tensor u = s.put(1, T, F, random_floats(size_t(T * F), 81, -2, 2));
                               Tensor out = in_place ? g : s.put(2, T, F);
                               ok(s.be->glu(g, u, act, out));
                               return Outputs{{"out", s.get(out)}};
                             }});
    e.bad.push_back({"up", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->glu(k.x4x64, k.x4x7, FfnAct::Silu, k.x4x64);
                     }});
    t.push_back(std::move(e));
  }

  // add
  {
    OpEntry e{"add", {0, 0}, {}, {}};
    for (auto [T, C] : Shapes{{1, 64}, {3, 100}})
      e.cases.push_back({shape_name(T, C), [T = T, C = C](Side& s) {
                           Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 90));
                           Tensor y = s.put(1, T, C, random_floats(size_t(T * C), 91));
                           ok(s.be->add(x, y));
                           return Outputs{{"x", s.get(x)}};
                         }});
    e.bad.push_back({"y", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->add(k.x4x64, k.x4x64.row_range(0, 2));
                     }});
    t.push_back(std::move(e));
  }

  // kv_row_norms: every cache type, rows written one batch earlier.
  {
    OpEntry e{"kv_row_norms", {1e-5f, 1e-5f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      for (int T : {1, 4})
        e.cases.push_back({std::string(dtype_name(kt)) + " T" + std::to_string(T),
                           [=](Side& s) {
                             auto c = s.cache(kv_cfg(2, 2, 32, kt, kt));
                             s.fill(*c, 2, 100);
                             s.fill(*c, T, 101);
                             Tensor n = s.put(0, 2, T);
                             ok(s.be->kv_row_norms(*c, 1, 2, T, n.row(0), n.row(1)));
                             return Outputs{{"norms", s.get(n)}};
                           }});
    e.bad.push_back({"T", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_row_norms(*k.cache, 0, 0, 0, k.row1x4, k.row1x4);
                     }});
    e.bad.push_back({"k_norm", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor small = s.put(6, 1, 2);
                       return s.be->kv_row_norms(*k.cache, 0, 0, 4, small, k.row1x4);
                     }});
    e.bad.push_back({"not held", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_row_norms(*k.cache, 1, 2, 4, k.row1x4, k.row1x4);
                     }});
    t.push_back(std::move(e));
  }

  // kv_row_errors: every cache type, including the zero row (error 0).
  {
    OpEntry e{"kv_row_errors", {1e-5f, 1e-4f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      e.cases.push_back({std::string(dtype_name(kt)), [=](Side& s) {
                           const int T = 3, W = 64;
                           auto c = s.cache(kv_cfg(1, 2, 32, kt, kt));
                           auto kd = random_floats(size_t(T * W), 110, -4, 4);
                           std::fill(kd.begin(), kd.begin() + W, 0.0f);  // a zero row
                           Tensor k = s.put(0, T, W, kd);
                           Tensor v = s.put(1, T, W, random_floats(size_t(T * W), 111));
                           ok(c->begin(0, T));
                           ok(s.be->kv_write(*c, 0, k, v, 0));
                           ok(c->end());
                           Tensor err = s.put(2, 2, T);
                           ok(s.be->kv_row_errors(*c, 0, 0, k, v, err.row(0), err.row(1)));
                           return Outputs{{"errors", s.get(err)}};
                         }});
    e.bad.push_back({"width", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_row_errors(*k.cache, 0, 0, k.q4x128, k.q4x128, k.row1x4,
                                                  k.row1x4);
                     }});
    e.bad.push_back({"k_err", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor small = s.put(6, 1, 2);
                       return s.be->kv_row_errors(*k.cache, 0, 0, k.k4x64, k.v4x64, small,
                                                  k.row1x4);
                     }});
    t.push_back(std::move(e));
  }

  // download: exact copies, including an empty tensor.
  {
    OpEntry e{"download", {0, 0}, {}, {}};
    for (auto [T, C] : Shapes{{1, 1}, {5, 77}, {0, 8}})
      e.cases.push_back({shape_name(T, C), [T = T, C = C](Side& s) {
                           Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 120));
                           return Outputs{{"x", s.get(x)}};
                         }});
    e.bad.push_back({"host", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->download(k.x4x64, nullptr);
                     }});
    t.push_back(std::move(e));
  }

  // kv_rerotate: every cache type, both pairings, forward and back; read through the
  // attention of a fixed query over the re-rotated keys.
  {
    OpEntry e{"kv_rerotate", {2e-4f, 2e-3f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      for (RopeStyle st : {RopeStyle::Adjacent, RopeStyle::NeoX})
        for (int delta : {-3, 5}) {
          if (st == RopeStyle::Adjacent && delta == 5 && kt != KvDtype::F32) continue;
          e.cases.push_back({std::string(dtype_name(kt)) +
                                 (st == RopeStyle::NeoX ? " neox" : " adjacent") + " delta " +
                                 std::to_string(delta),
                             [=](Side& s) {
                               const int H = 2, D = 32, n = 8;
                               auto c = s.cache(kv_cfg(1, 1, D, kt, kt));
                               s.fill(*c, n, 130);
                               ok(s.be->kv_rerotate(*c, 0, RopeSpec{st, 32, 10000.f, 1.f}, 3,
                                                    delta));
                               Tensor q = s.put(0, 1, H * D, random_floats(size_t(H * D), 131));
                               Tensor out = s.put(1, 1, H * D);
                               Tensor probs = s.put(2, H, n);
                               ok(s.be->attention(q, *c, 0, n - 1, H, 0.5f, out, probs));
                               return Outputs{{"out", s.get(out)}, {"probs", s.get(probs)}};
                             }});
        }
    e.bad.push_back({"n_rot", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_rerotate(*k.cache, 0, RopeSpec{RopeStyle::NeoX, 64}, 0, 1);
                     }});
    e.bad.push_back({"layer", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->kv_rerotate(*k.cache, 5, neox, 0, 1);
                     }});
    t.push_back(std::move(e));
  }

  // matmul_qkv: the fused types (Q4_1, Q8_0) and ones that fall back (Q4_0, F16, Q6_K);
  // decode rows and a longer block.
  {
    OpEntry e{"matmul_qkv", {1e-3f, 1e-4f}, {}, {}};
    for (GgmlType ty : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16,
                        GgmlType::Q6_K}) {
      const int64_t C = 256;
      const Weight wq = make_weight(ty, C, 128, 140), wk = make_weight(ty, C, 64, 141),
                   wv = make_weight(ty, C, 64, 142);
      for (int T : {1, 3, 9})
        e.cases.push_back({ggml_type_name(ty) + " T" + std::to_string(T), [=](Side& s) {
                             Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 143));
                             Tensor q = s.put(1, T, 128), k = s.put(2, T, 64), v = s.put(3, T, 64);
                             ok(s.be->matmul_qkv(wq, wk, wv, x, q, k, v));
                             return Outputs{{"q", s.get(q)}, {"k", s.get(k)}, {"v", s.get(v)}};
                           }});
    }
    e.bad.push_back({"k", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor q = s.put(6, 4, 40);
                       return s.be->matmul_qkv(k.w64x40, k.w64x40, k.w64x40, k.x4x64, q, k.k4x64,
                                               q);
                     }});
    t.push_back(std::move(e));
  }

  // matmul_glu: fused types and a fallback, both activations. act(gate)·up multiplies two
  // products, each within matmul's relative tolerance: twice it.
  {
    OpEntry e{"matmul_glu", {1e-3f, 2e-4f}, {}, {}};
    for (GgmlType ty : {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K})
      for (FfnAct act : {FfnAct::Silu, FfnAct::GeluTanh}) {
        const int64_t C = 256, F = 96;
        const Weight wg = make_weight(ty, C, F, 150), wu = make_weight(ty, C, F, 151);
        for (int T : {1, 9})
          e.cases.push_back({ggml_type_name(ty) + (act == FfnAct::Silu ? " silu" : " gelu_tanh") +
                                 " T" + std::to_string(T),
                             [=](Side& s) {
                               Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 152));
                               Tensor out = s.put(1, T, F), up = s.put(2, T, F);
                               ok(s.be->matmul_glu(wg, wu, x, act, out, up));
                               return Outputs{{"out", s.get(out)}};
                             }});
      }
    e.bad.push_back({"w_up", [](Side& s) {
                       BadKit k = bad_kit(s);
                       static const Weight wu = make_weight(GgmlType::Q8_0, 64, 41, 904);
                       Tensor out = s.put(6, 4, 40), up = s.put(7, 4, 40);
                       return s.be->matmul_glu(k.w64x40, wu, k.x4x64, FfnAct::Silu, out, up);
                     }});
    e.bad.push_back({"up", [](Side& s) {
                       BadKit k = bad_kit(s);
                       Tensor out = s.put(6, 4, 40), up = s.put(7, 4, 39);
                       return s.be->matmul_glu(k.w64x40, k.w64x40, k.x4x64, FfnAct::Silu, out,
                                               up);
                     }});
    t.push_back(std::move(e));
  }

  // rope_kv_write: cache types, both pairings, decode and a block.
  {
    OpEntry e{"rope_kv_write", {2e-5f, 1e-4f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      for (RopeStyle st : {RopeStyle::Adjacent, RopeStyle::NeoX})
        for (int T : {1, 3}) {
          if (st == RopeStyle::Adjacent && kt != KvDtype::F16) continue;
          e.cases.push_back({std::string(dtype_name(kt)) +
                                 (st == RopeStyle::NeoX ? " neox" : " adjacent") + " T" +
                                 std::to_string(T),
                             [=](Side& s) {
                               const int H = 4, Hkv = 2, D = 32, pos0 = 5;
                               auto c = s.cache(kv_cfg(2, Hkv, D, kt, kt));
                               s.fill(*c, pos0, 160);
                               Tensor q = s.put(0, T, H * D, random_floats(size_t(T * H * D), 161));
                               Tensor k = s.put(1, T, Hkv * D, random_floats(size_t(T * Hkv * D), 162));
                               Tensor v = s.put(2, T, Hkv * D, random_floats(size_t(T * Hkv * D), 163));
                               ok(c->begin(pos0, T));
                               ok(s.be->rope_kv_write(q, k, v, *c, 1, H,
                                                      RopeSpec{st, 32, 10000.f, 1.f}, pos0));
                               Tensor err = s.put(3, 2, T);
                               ok(s.be->kv_row_errors(*c, 1, pos0, k, v, err.row(0), err.row(1)));
                               ok(c->end());
                               return Outputs{{"q", s.get(q)}, {"k", s.get(k)}, {"errors", s.get(err)}};
                             }});
        }
    e.bad.push_back({"q width", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rope_kv_write(k.x4x64, k.k4x64, k.v4x64, *k.cache, 0, 4, neox, 0);
                     }});
    e.bad.push_back({"rows", [neox](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->rope_kv_write(k.q4x128.row_range(0, 2), k.k4x64, k.v4x64,
                                                  *k.cache, 0, 4, neox, 0);
                     }});
    t.push_back(std::move(e));
  }

  // add_rmsnorm: separate output and the output on top of y (the unfused path on CUDA).
  {
    OpEntry e{"add_rmsnorm", {1e-5f, 1e-5f}, {}, {}};
    for (auto [T, C] : Shapes{{1, 64}, {4, 96}})
      for (bool out_is_y : {false, true}) {
        const Weight w = make_vector(C, 170 + C);
        e.cases.push_back({shape_name(T, C) + (out_is_y ? " out = y" : ""),
                           [=, T = T, C = C](Side& s) {
                             Tensor x = s.put(0, T, C, random_floats(size_t(T * C), 171, -3, 3));
                             Tensor y = s.put(1, T, C, random_floats(size_t(T * C), 172));
                             Tensor out = out_is_y ? y : s.put(2, T, C);
                             ok(s.be->add_rmsnorm(x, y, w, 1e-6f, out));
                             return Outputs{{"x", s.get(x)}, {"out", s.get(out)}};
                           }});
      }
    e.bad.push_back({"y", [](Side& s) {
                       BadKit k = bad_kit(s);
                       return s.be->add_rmsnorm(k.x4x64, k.x4x7, k.vec64, 1e-6f, k.v4x64);
                     }});
    t.push_back(std::move(e));
  }

  // rope_kv_write_rows: four sequences of different lengths (8-position blocks: rows in
  // the first, second and third block) in one call, every cache type; then each row's
  // stored K/V read back (kv_row_errors of its own cache at its own position) and one
  // attention over all rows, so a row stored through another's table or at another's
  // position shows.
  {
    OpEntry e{"rope_kv_write_rows", {2e-5f, 1e-4f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      e.cases.push_back({std::string(dtype_name(kt)) + " 4 rows", [=](Side& s) {
                           const int H = 4, Hkv = 2, D = 32, B = 4;
                           RowsKit rk = rows_kit(s, kv_cfg(2, Hkv, D, kt, kt), {3, 8, 17, 12}, 180);
                           Tensor q = s.put(0, B, H * D, random_floats(size_t(B * H * D), 181));
                           Tensor k = s.put(1, B, Hkv * D, random_floats(size_t(B * Hkv * D), 182));
                           Tensor v = s.put(2, B, Hkv * D, random_floats(size_t(B * Hkv * D), 183));
                           for (int b = 0; b < B; ++b)
                             ok(rk.caches[size_t(b)]->begin(rk.pos[size_t(b)], 1));
                           const DecodeRows dr = rk.rows();
                           ok(s.be->rope_kv_write_rows(
                               q, k, v, dr, 1, H, RopeSpec{RopeStyle::NeoX, 32, 10000.f, 1.f}));
                           Tensor err = s.put(3, 2, B);
                           for (int b = 0; b < B; ++b)
                             ok(s.be->kv_row_errors(*rk.caches[size_t(b)], 1, rk.pos[size_t(b)],
                                                    k.row(b), v.row(b), Tensor{err.data + b, 1, 1},
                                                    Tensor{err.data + B + b, 1, 1}));
                           Tensor out = s.put(4, B, H * D);
                           ok(s.be->attention_rows(q, dr, 1, H, 0.17677669f, out));
                           for (auto& c : rk.caches) ok(c->end());
                           return Outputs{{"q", s.get(q)},
                                          {"k", s.get(k)},
                                          {"errors", s.get(err)},
                                          {"attention", s.get(out)}};
                         }});
    e.bad.push_back({"rows", [](Side& s) {
                       BadKit k = bad_kit(s);
                       KvCache* c[2] = {k.cache.get(), k.cache.get()};
                       const int pos[2] = {3, 3};
                       return s.be->rope_kv_write_rows(k.q4x128, k.k4x64, k.v4x64,
                                                       DecodeRows{c, pos, 2}, 0, 4,
                                                       RopeSpec{RopeStyle::NeoX, 32});
                     }});
    e.bad.push_back({"same cache twice", [](Side& s) {
                       BadKit k = bad_kit(s);
                       KvCache* c[4] = {k.cache.get(), k.cache.get(), k.cache.get(), k.cache.get()};
                       const int pos[4] = {3, 3, 3, 3};
                       return s.be->rope_kv_write_rows(k.q4x128, k.k4x64, k.v4x64,
                                                       DecodeRows{c, pos, 4}, 0, 4,
                                                       RopeSpec{RopeStyle::NeoX, 32});
                     }});
    t.push_back(std::move(e));
  }

  // attention_rows: five sequences of different lengths (1 to 21 positions, 8-position
  // blocks), every cache type, all keys or a window of 4 with a sink, 4 query heads over
  // 2 kv heads. Each row must read its own table, slot map and position.
  {
    OpEntry e{"attention_rows", {2e-4f, 2e-3f}, {}, {}};
    for (KvDtype kt : kKvTypes)
      for (int window : {0, 4})
        e.cases.push_back(
            {std::string(dtype_name(kt)) + " window " + std::to_string(window), [=](Side& s) {
               const int H = 4, Hkv = 2, D = 32, B = 5;
               RowsKit rk = rows_kit(s, kv_cfg(2, Hkv, D, kt, kt, window, window ? 1 : 0),
                                     {9, 1, 21, 8, 16}, 190);
               for (int b = 0; b < B; ++b) rk.pos[size_t(b)] -= 1;  // the last held
               Tensor q = s.put(0, B, H * D, random_floats(size_t(B * H * D), 191, -2, 2));
               Tensor out = s.put(1, B, H * D);
               ok(s.be->attention_rows(q, rk.rows(), 1, H, 0.17677669f, out));
               return Outputs{{"out", s.get(out)}};
             }});
    e.bad.push_back(
        {"rows", [](Side& s) {
           BadKit k = bad_kit(s);
           KvCache* c[1] = {k.cache.get()};
           const int pos[1] = {3};
           return s.be->attention_rows(k.q4x128, DecodeRows{c, pos, 1}, 0, 4, 1.f, k.q4x128);
         }});
    e.bad.push_back({"not held", [](Side& s) {
                       BadKit k = bad_kit(s);
                       KvCache* c[1] = {k.cache.get()};
                       const int pos[1] = {4};
                       return s.be->attention_rows(k.q4x128.row(0), DecodeRows{c, pos, 1}, 0, 4,
                                                   1.f, k.q4x128.row(1));
                     }});
    t.push_back(std::move(e));
  }
  add_fused_layer_entries(t);
  return t;
}

const std::vector<OpEntry>& table() {
  static const std::vector<OpEntry> t = op_table();
  return t;
}

// --- Runners ------------------------------------------------------------------------------

// Runs every case of the table on both sides and compares; returns the number of cases.
int run_parity(Side& ref, Side& test, const std::vector<OpEntry>& ops) {
  int n = 0;
  for (const OpEntry& e : ops) {
    float worst = 0, largest = 0;
    size_t values = 0;
    for (const Case& c : e.cases) {
      ++n;
      SCOPED_TRACE(std::string(e.op) + " [" + c.name + "]");
      Outputs want, got;
      try {
        want = c.run(ref);
      } catch (const OpFailed& f) {
        ADD_FAILURE() << ref.label << " failed: " << f.what();
        continue;
      }
      try {
        got = c.run(test);
      } catch (const OpFailed& f) {
        ADD_FAILURE() << test.label << " failed: " << f.what();
        continue;
      }
      const Tol tol = e.tol;
      EXPECT_EQ(got.size(), want.size());
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        EXPECT_TRUE(kvscope::test::all_close(got[i].second, want[i].second, tol.abs, tol.rel))
            << e.op << " [" << c.name << "] output " << want[i].first << ": " << test.label
            << " vs " << ref.label << " (abs " << tol.abs << ", rel " << tol.rel << ")";
        for (size_t j = 0; j < std::min(got[i].second.size(), want[i].second.size()); ++j) {
          worst = std::max(worst, std::fabs(got[i].second[j] - want[i].second[j]));
          largest = std::max(largest, std::fabs(want[i].second[j]));
          ++values;
        }
      }
    }
    std::printf("  %-16s %3zu cases %7zu values  max |diff| %.2e  max |want| %.2e  (abs %.0e, rel %.0e)\n",
                e.op, e.cases.size(), values, double(worst), double(largest), double(e.tol.abs),
                double(e.tol.rel));
  }
  return n;
}

// Runs every bad call on both sides: each must fail, with the same message, naming its op.
int run_bad_calls(Side& a, Side& b, const std::vector<OpEntry>& ops) {
  int n = 0;
  for (const OpEntry& e : ops)
    for (const BadCall& c : e.bad) {
      ++n;
      SCOPED_TRACE(std::string(e.op) + " bad call [" + c.name + "]");
      Status sa = Status::Ok(), sb = Status::Ok();
      try {
        sa = c.run(a);
        sb = c.run(b);
      } catch (const OpFailed& f) {
        ADD_FAILURE() << "setting up the call failed: " << f.what();
        continue;
      }
      EXPECT_FALSE(sa.ok()) << a.label << " accepted it";
      EXPECT_FALSE(sb.ok()) << b.label << " accepted it";
      EXPECT_EQ(sa.message(), sb.message());
      EXPECT_EQ(sa.message().rfind(std::string(e.op) + ": ", 0), 0u) << sa.message();
    }
  return n;
}

// --- The probe: a backend that only records which do_<op> ran ---------------------------

class ProbeCache final : public KvCache {
 public:
  explicit ProbeCache(KvCacheConfig c) : KvCache(std::move(c)) {}
  Status init(int slots) { return init_storage(slots); }

 protected:
  Status relayout(int, int, const std::vector<int32_t>&) override { return Status::Ok(); }
};

// Overrides every do_<op>: a new pure virtual in Backend makes this class abstract and
// this file fail to build until the probe (and then the table) knows the op. (The rows
// ops' do_<op> have defaults; the probe overrides them so that their cases count.)
class ProbeBackend final : public Backend {
 public:
  std::set<std::string> seen;

  std::string name() const override { return "probe"; }
  const char* kind() const override { return "probe"; }
  int threads() const override { return 0; }
  bool can_measure_kv_errors() const override { return true; }

 protected:
  Expected<Tensor> do_scratch(int slot, int64_t rows, int64_t cols) override {
    seen.insert("scratch");
    if (size_t(slot) >= mem_.size()) mem_.resize(size_t(slot) + 1);
    auto& m = mem_[size_t(slot)];
    if (m.size() < size_t(rows * cols)) m.resize(size_t(rows * cols));
    return Tensor{m.data(), rows, cols};
  }
  Expected<std::unique_ptr<KvCache>> do_create_kv_cache(const KvCacheConfig& c,
                                                        int capacity) override {
    seen.insert("create_kv_cache");
    auto p = std::make_unique<ProbeCache>(c);
    KV_TRY(p->init(std::max(capacity, 1)));
    return std::unique_ptr<KvCache>(std::move(p));
  }
  Status do_embed(const Weight&, const int32_t*, float, Tensor) override { return hit("embed"); }
  Status do_rmsnorm(Tensor, const Weight&, float, Tensor) override { return hit("rmsnorm"); }
  Status do_matmul(const Weight&, Tensor, Tensor) override { return hit("matmul"); }
  Status do_add_bias(Tensor, const Weight&) override { return hit("add_bias"); }
  Status do_rope(Tensor, int, int, const RopeSpec&, int) override { return hit("rope"); }
  Status do_kv_write(KvCache&, int, Tensor, Tensor, int) override { return hit("kv_write"); }
  Status do_attention(Tensor, const KvCache&, int, int, int, float, Tensor, Tensor) override {
    return hit("attention");
  }
  Status do_glu(Tensor, Tensor, FfnAct, Tensor) override { return hit("glu"); }
  Status do_add(Tensor, Tensor) override { return hit("add"); }
  Status do_kv_row_norms(const KvCache&, int, int, int, Tensor, Tensor) override {
    return hit("kv_row_norms");
  }
  Status do_kv_row_errors(const KvCache&, int, int, Tensor, Tensor, Tensor, Tensor) override {
    return hit("kv_row_errors");
  }
  Status do_download(Tensor, float*) override { return hit("download"); }
  Status do_kv_rerotate(KvCache&, int, const RopeSpec&, int, int) override {
    return hit("kv_rerotate");
  }
  Status do_matmul_qkv(const Weight&, const Weight&, const Weight&, Tensor, Tensor, Tensor,
                       Tensor) override {
    return hit("matmul_qkv");
  }
  Status do_matmul_glu(const Weight&, const Weight&, Tensor, FfnAct, Tensor, Tensor) override {
    return hit("matmul_glu");
  }
  Status do_rope_kv_write(Tensor, Tensor, Tensor, KvCache&, int, int, const RopeSpec&,
                          int) override {
    return hit("rope_kv_write");
  }
  Status do_add_rmsnorm(Tensor, Tensor, const Weight&, float, Tensor) override {
    return hit("add_rmsnorm");
  }
  Status do_norm_qkv_kv_write(const ResidualNorm&, const QkvStore&) override {
    return hit("norm_qkv_kv_write");
  }
  Status do_norm_ffn(const ResidualNorm&, const FfnWeights&, Tensor, Tensor, Tensor) override {
    return hit("norm_ffn");
  }
  Status do_rope_kv_write_rows(Tensor, Tensor, Tensor, const DecodeRows&, int, int,
                               const RopeSpec&) override {
    return hit("rope_kv_write_rows");
  }
  Status do_attention_rows(Tensor, const DecodeRows&, int, int, float, Tensor) override {
    return hit("attention_rows");
  }

 private:
  Status hit(const char* op) {
    seen.insert(op);
    return Status::Ok();
  }
  std::vector<std::vector<float>> mem_;
};

// --- Tests -------------------------------------------------------------------------------

// The table has exactly one entry per op of kBackendOps, each with cases and bad calls.
TEST(BackendOps, TableCoversEveryOp) {
  std::multiset<std::string> in_table;
  for (const OpEntry& e : table()) {
    in_table.insert(e.op);
    EXPECT_FALSE(e.cases.empty()) << e.op << " has no cases";
    EXPECT_FALSE(e.bad.empty()) << e.op << " has no bad calls";
  }
  std::multiset<std::string> in_header(kBackendOps.begin(), kBackendOps.end());
  EXPECT_EQ(in_header.size(), std::set<std::string>(in_header.begin(), in_header.end()).size())
      << "kBackendOps names an op twice";
  for (const auto& op : in_header)
    EXPECT_EQ(in_table.count(op), 1u) << "Backend op '" << op << "' needs one table entry";
  for (const auto& op : in_table)
    EXPECT_EQ(in_header.count(op), 1u) << "table entry '" << op << "' is not in kBackendOps";
  EXPECT_EQ(table().size(), kBackendOps.size());
}

// Each entry's cases reach its op's do_<op> (through the wrapper), and every do_<op> the
// probe overrides belongs to an op of kBackendOps.
TEST(BackendOps, EveryEntryRunsItsOp) {
  std::set<std::string> all;
  for (const OpEntry& e : table()) {
    ProbeBackend probe;
    Side side{"probe", &probe, [](Tensor t, const float* h) {
                std::memcpy(t.data, h, size_t(t.size()) * sizeof(float));
                return Status::Ok();
              }};
    for (const Case& c : e.cases) {
      try {
        c.run(side);
      } catch (const OpFailed& f) {
        ADD_FAILURE() << e.op << " [" << c.name << "] on the probe: " << f.what();
      }
    }
    EXPECT_EQ(probe.seen.count(e.op), 1u) << "the cases of '" << e.op << "' never run it";
    all.insert(probe.seen.begin(), probe.seen.end());
  }
  for (const auto& op : all)
    EXPECT_NE(std::find(kBackendOps.begin(), kBackendOps.end(), op), kBackendOps.end())
        << "the probe ran do_" << op << ", which kBackendOps does not list";
  EXPECT_EQ(all.size(), kBackendOps.size());
}

class BackendOpsParity : public CudaBackendParity {
 protected:
  void SetUp() override {
    CudaBackendParity::SetUp();
    if (IsSkipped()) return;
    test::TinyModelSpec spec;
    model_ = load_tiny(spec, "backend_ops");
    ASSERT_TRUE(model_);
    cpu_ = make_cpu_backend(2);
    auto c = make_cuda_backend(*model_);
    ASSERT_TRUE(c.ok()) << c.error().message;
    cuda_ = std::move(c.value());
  }
  void TearDown() override {
    cuda_.reset();
    CudaBackendParity::TearDown();
  }
  std::shared_ptr<Model> model_;
  std::unique_ptr<Backend> cpu_, cuda_;
};

TEST_F(BackendOpsParity, EveryOpCpuVsCuda) {
  Side ref = cpu_side(*cpu_), test = cuda_side(*cuda_);
  const int n = run_parity(ref, test, table());
  std::printf("backend ops: %d cases over %zu ops, %s vs %s\n", n, table().size(),
              test.label.c_str(), ref.label.c_str());
}

TEST_F(BackendOpsParity, BadShapesFailAlikeOnBothBackends) {
  Side a = cpu_side(*cpu_), b = cuda_side(*cuda_);
  const int n = run_bad_calls(a, b, table());
  std::printf("backend ops: %d bad calls, the same message on %s and %s\n", n, a.label.c_str(),
              b.label.c_str());
}

// The wording of the kinds of error (backend.cpp), as the bad calls above produce it.
TEST_F(BackendOpsParity, ErrorMessagesNameOpArgumentValueAndExpectation) {
  Side s = cpu_side(*cpu_);
  BadKit k = bad_kit(s);
  EXPECT_EQ(cpu_->matmul(k.w64x40, k.x4x7, k.q4x128).message(),
            "matmul: x.cols is 7, expected w.n_in = 64");
  EXPECT_EQ(cpu_->attention(k.q4x128, *k.cache, -1, 0, 4, 1.f, k.q4x128, {}).message(),
            "attention: layer is -1, expected [0, 2)");
  EXPECT_EQ(cpu_->attention(k.q4x128, *k.cache, 0, 0, 3, 1.f, k.q4x128, {}).message(),
            "attention: n_head is 3, expected a multiple of n_head_kv = 2");
  EXPECT_EQ(cpu_->rope(k.x4x64, 2, 32, RopeSpec{RopeStyle::NeoX, 7}, 0).message(),
            "rope: rope.n_rot is 7, expected an even number");
  EXPECT_EQ(cpu_->download(k.x4x64, nullptr).message(), "download: host is null, expected a pointer");
  EXPECT_EQ(cpu_->kv_write(*k.cache, 0, k.k4x64, k.v4x64, 2).message(),
            "kv_write: position 4 of layer 0 is not in the cache, expected begin() to have made "
            "room for it");
  EXPECT_EQ(cpu_->kv_row_norms(*k.cache, 0, 0, 4, s.put(6, 1, 2), k.row1x4).message(),
            "kv_row_norms: k_norm.cols is 2, expected >= T = 4");
}

}  // namespace
}  // namespace kvscope
