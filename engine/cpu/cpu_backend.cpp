// cpu_backend.cpp — Backend ops on the CPU. Tensors are host memory; the KV cache is
// per layer K and V, each [Hkv][capacity][D] in f16 or f32. Loops over rows/heads are
// split across the thread pool; each output element is written by one thread, so
// results do not depend on the thread count.
#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/packed_weight.h"
#include "engine/cpu/thread_pool.h"
#include "engine/quant.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kvscope {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

Buffer alloc_bytes(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  return Buffer(static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>(64, rounded))));
}

class CpuKvCache final : public KvCache {
 public:
  CpuKvCache(KvShape shape, KvDtype dtype) : KvCache(shape, dtype) {
    k_.resize(size_t(shape.n_layer));
    v_.resize(size_t(shape.n_layer));
  }
  Status reserve(int n_tokens) override {
    if (n_tokens <= capacity_) return Status::Ok();
    int cap = std::max(n_tokens, std::max(64, capacity_ * 2));
    const KvShape& s = shape();
    const size_t elem = size_t(kv_dtype_bytes(dtype()));
    const size_t row = size_t(s.head_dim) * elem;
    for (int l = 0; l < s.n_layer; ++l) {
      for (auto* side : {&k_, &v_}) {
        Buffer fresh = alloc_bytes(size_t(s.n_head_kv) * size_t(cap) * row);
        if (!fresh)
          return make_error("cpu: out of memory growing the KV cache to ", cap, " tokens");
        Buffer& old = (*side)[size_t(l)];
        if (old)
          for (int h = 0; h < s.n_head_kv; ++h)
            std::memcpy(fresh.get() + size_t(h) * cap * row, old.get() + size_t(h) * capacity_ * row,
                        size_t(length()) * row);
        old = std::move(fresh);
      }
    }
    capacity_ = cap;
    return Status::Ok();
  }
  int capacity() const override { return capacity_; }

  // Row of head h at position p in layer l (K or V).
  uint8_t* row(bool is_v, int l, int h, int p) const {
    const KvShape& s = shape();
    const size_t row_bytes = size_t(s.head_dim) * kv_dtype_bytes(dtype());
    const Buffer& b = (is_v ? v_ : k_)[size_t(l)];
    return b.get() + (size_t(h) * capacity_ + size_t(p)) * row_bytes;
  }

 private:
  int capacity_ = 0;
  std::vector<Buffer> k_, v_;
};

// Loads D values of a cache row as fp32.
void load_row(KvDtype dtype, const uint8_t* src, float* dst, int D) {
  if (dtype == KvDtype::F32) {
    std::memcpy(dst, src, size_t(D) * 4);
  } else {
#if defined(__AVX512F__)
    int i = 0;
    for (; i + 16 <= D; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(
                                    reinterpret_cast<const __m256i*>(src + 2 * i))));
    for (; i < D; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = _cvtsh_ss(h);
    }
    return;
#endif
    const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
    for (int i = 0; i < D; ++i) dst[i] = fp16_to_fp32(h[i]);
  }
}

void store_row(KvDtype dtype, const float* src, uint8_t* dst, int D) {
  if (dtype == KvDtype::F32) {
    std::memcpy(dst, src, size_t(D) * 4);
  } else {
#if defined(__AVX512F__)
    int i = 0;
    for (; i + 16 <= D; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < D; ++i) {
      const uint16_t h = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
      std::memcpy(dst + 2 * i, &h, 2);
    }
    return;
#endif
    uint16_t* h = reinterpret_cast<uint16_t*>(dst);
    for (int i = 0; i < D; ++i) h[i] = fp32_to_fp16(src[i]);
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}

  std::string name() const override {
    return "cpu (" + std::to_string(pool_.size()) + (pool_.size() == 1 ? " thread, " : " threads, ") +
           cpu::isa_name(cpu::isa_active()) + ")";
  }

  Expected<Tensor> scratch(int slot, int64_t rows, int64_t cols) override {
    if (slot < 0 || slot > 64) return make_error("cpu: scratch slot ", slot, " out of range [0, 64]");
    if (size_t(slot) >= slots_.size()) {
      slots_.resize(size_t(slot) + 1);
      slot_sizes_.resize(size_t(slot) + 1, 0);
    }
    size_t need = size_t(rows * cols) * sizeof(float);
    if (need > slot_sizes_[size_t(slot)]) {
      slots_[size_t(slot)] = alloc_bytes(need);
      if (!slots_[size_t(slot)]) return make_error("cpu: out of memory allocating ", need, " bytes");
      slot_sizes_[size_t(slot)] = need;
    }
    return Tensor{reinterpret_cast<float*>(slots_[size_t(slot)].get()), rows, cols};
  }

  Expected<std::unique_ptr<KvCache>> create_kv_cache(KvShape shape, KvDtype dtype,
                                                     int capacity) override {
    auto cache = std::make_unique<CpuKvCache>(shape, dtype);
    KV_TRY(cache->reserve(capacity));
    return std::unique_ptr<KvCache>(std::move(cache));
  }

  Status embed(const Weight& tok_embd, const int32_t* ids, Tensor out) override {
    for (int64_t t = 0; t < out.rows; ++t) {
      if (ids[t] < 0 || ids[t] >= tok_embd.n_out)
        return make_error("cpu: token id ", ids[t], " is outside the vocabulary [0, ",
                          tok_embd.n_out, ")");
      dequantize_row(tok_embd.type, tok_embd.data + uint64_t(ids[t]) * tok_embd.row_bytes,
                     out.data + t * out.cols, out.cols);
    }
    return Status::Ok();
  }

  Status rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) override {
    const float* g = reinterpret_cast<const float*>(w.data);
    const int64_t C = x.cols;
    for_rows(x.rows, C, [&](int64_t t) {
      const float* xr = x.data + t * C;
      float* o = out.data + t * C;
      double ss = 0;
      for (int64_t i = 0; i < C; ++i) ss += double(xr[i]) * xr[i];
      const float scale = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
      for (int64_t i = 0; i < C; ++i) o[i] = xr[i] * scale * g[i];
    });
    return Status::Ok();
  }

  Status matmul(const Weight& w, Tensor x, Tensor out) override {
    const Weight* ws[1] = {&w};
    float* outs[1] = {out.data};
    return matmul_jobs(ws, outs, 1, x);
  }

  Status matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x, Tensor q,
                    Tensor k, Tensor v) override {
    const Weight* ws[3] = {&wq, &wk, &wv};
    float* outs[3] = {q.data, k.data, v.data};
    return matmul_jobs(ws, outs, 3, x);
  }

  Status matmul_gate_up_silu(const Weight& w_gate, const Weight& w_up, Tensor x, Tensor out,
                             Tensor up) override {
    const Weight* ws[2] = {&w_gate, &w_up};
    float* outs[2] = {out.data, up.data};
    KV_TRY(matmul_jobs(ws, outs, 2, x));
    return silu_mul(out, up, out);
  }

  Status rope(Tensor x, int n_heads, int head_dim, int n_rot, int pos0, float base) override {
    std::vector<float> cs(static_cast<size_t>(n_rot));
    for (int64_t t = 0; t < x.rows; ++t) {
      const double pos = double(pos0 + t);
      for (int i = 0; i < n_rot / 2; ++i) {
        const double theta = pos * std::pow(double(base), -2.0 * i / double(n_rot));
        cs[size_t(2 * i)] = float(std::cos(theta));
        cs[size_t(2 * i + 1)] = float(std::sin(theta));
      }
      float* row = x.data + t * x.cols;
      for (int h = 0; h < n_heads; ++h) {
        float* v = row + h * head_dim;
        for (int i = 0; i < n_rot / 2; ++i) {
          const float c = cs[size_t(2 * i)], s = cs[size_t(2 * i + 1)];
          const float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * c - x1 * s;
          v[2 * i + 1] = x0 * s + x1 * c;
        }
      }
    }
    return Status::Ok();
  }

  Status kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) override {
    auto& c = static_cast<CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    if (pos0 + k.rows > c.capacity())
      return make_error("cpu: kv_write past the cache capacity (", pos0 + k.rows, " > ",
                        c.capacity(), ")");
    for (int64_t t = 0; t < k.rows; ++t)
      for (int h = 0; h < Hkv; ++h) {
        store_row(c.dtype(), k.data + t * k.cols + h * D, c.row(false, layer, h, int(pos0 + t)), D);
        store_row(c.dtype(), v.data + t * v.cols + h * D, c.row(true, layer, h, int(pos0 + t)), D);
      }
    return Status::Ok();
  }

  Status attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head, Tensor out,
                   Tensor probs_last) override {
    const auto& c = static_cast<const CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    const int group = n_head / Hkv;
    const int64_t T = q.rows;
    const int n_keys = int(pos0 + T);
    const float scale = 1.0f / std::sqrt(float(D));
    // K and V of every kv head as fp32, [2][Hkv][n_keys][D], converted once per call.
    const size_t plane = size_t(n_keys) * D;
    kv_f32_.resize(2 * size_t(Hkv) * plane);
    auto convert = [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int hk = int(r / n_keys), j = int(r % n_keys);
        load_row(c.dtype(), c.row(false, layer, hk, j), kv_f32_.data() + hk * plane + size_t(j) * D, D);
        load_row(c.dtype(), c.row(true, layer, hk, j),
                 kv_f32_.data() + (Hkv + hk) * plane + size_t(j) * D, D);
      }
    };
    // Short caches are converted on this thread: a hand-off would cost more.
    if (int64_t(Hkv) * n_keys <= 4096) {
      convert(0, int64_t(Hkv) * n_keys);
    } else {
      pool_.parallel_for(int64_t(Hkv) * n_keys, convert);
    }
    // One work item per (query row, head).
    const int64_t items = T * n_head;
    pool_.parallel_for(items, [&](int64_t b, int64_t e) {
      std::vector<float> scores(static_cast<size_t>(n_keys));
      std::vector<float> acc(static_cast<size_t>(D));
      for (int64_t it = b; it < e; ++it) {
        const int64_t t = it / n_head;
        const int h = int(it % n_head), hk = h / group;
        const int n = int(pos0 + t + 1);  // causal: keys [0, pos0 + t]
        const float* qv = q.data + t * q.cols + h * D;
        const float* K = kv_f32_.data() + hk * plane;
        const float* Vv = kv_f32_.data() + (Hkv + hk) * plane;
        float mx = -INFINITY;
        for (int j = 0; j < n; ++j) {
          const float sc = cpu::dot_f32(qv, K + size_t(j) * D, D) * scale;
          scores[size_t(j)] = sc;
          mx = std::max(mx, sc);
        }
        double sum = 0;
        for (int j = 0; j < n; ++j) {
          scores[size_t(j)] = std::exp(scores[size_t(j)] - mx);
          sum += scores[size_t(j)];
        }
        const float inv = float(1.0 / sum);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = 0; j < n; ++j) {
          const float p = scores[size_t(j)] * inv;
          scores[size_t(j)] = p;
          cpu::axpy_f32(p, Vv + size_t(j) * D, acc.data(), D);
        }
        std::memcpy(out.data + t * out.cols + h * D, acc.data(), size_t(D) * 4);
        if (t == T - 1 && probs_last.data)
          std::memcpy(probs_last.data + int64_t(h) * probs_last.cols, scores.data(),
                      size_t(n) * 4);
      }
    });
    return Status::Ok();
  }

  Status silu_mul(Tensor gate, Tensor up, Tensor out) override {
    const int64_t n = gate.size();
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate.data[i];
      out.data[i] = g / (1.0f + std::exp(-g)) * up.data[i];
    }
    return Status::Ok();
  }

  Status add(Tensor x, Tensor y) override {
    const int64_t n = x.size();
    for (int64_t i = 0; i < n; ++i) x.data[i] += y.data[i];
    return Status::Ok();
  }

  Status kv_row_norms(const KvCache& cache, int layer, int pos0, int T, Tensor k_norm,
                      Tensor v_norm) override {
    const auto& c = static_cast<const CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    std::vector<float> row(static_cast<size_t>(D));
    for (int t = 0; t < T; ++t) {
      double sk = 0, sv = 0;
      for (int h = 0; h < Hkv; ++h) {
        load_row(c.dtype(), c.row(false, layer, h, pos0 + t), row.data(), D);
        for (float f : row) sk += double(f) * f;
        load_row(c.dtype(), c.row(true, layer, h, pos0 + t), row.data(), D);
        for (float f : row) sv += double(f) * f;
      }
      k_norm.data[t] = float(std::sqrt(sk));
      v_norm.data[t] = float(std::sqrt(sv));
    }
    return Status::Ok();
  }

  Status download(Tensor src, float* host) override {
    std::memcpy(host, src.data, size_t(src.size()) * sizeof(float));
    return Status::Ok();
  }

 private:
  // The packed copy of w (engine/cpu/packed_weight.h), made on first use and kept for
  // the backend's lifetime; a weight without a uid is packed into `temp` for this call.
  Expected<const cpu::PackedWeight*> packed(const Weight& w,
                                            std::unique_ptr<cpu::PackedWeight>& temp) {
    if (w.uid != 0)
      if (auto it = packed_.find(w.uid); it != packed_.end()) return it->second.get();
    auto p = cpu::pack_weight(w, pool_);
    if (!p)
      return make_error("cpu: cannot pack weight '", w.name, "' (type ", ggml_type_name(w.type),
                        ", ", w.n_in, " x ", w.n_out, "): out of memory or unsupported type");
    const cpu::PackedWeight* raw = p.get();
    if (w.uid != 0) {
      packed_[w.uid] = std::move(p);
    } else {
      temp = std::move(p);
    }
    return raw;
  }

  // out[j] = x · ws[j]ᵀ for n jobs (at most 3) in one parallel region.
  Status matmul_jobs(const Weight* const* ws, float* const* outs, int n, Tensor x) {
    cpu::MatmulJob jobs[3];
    std::unique_ptr<cpu::PackedWeight> temp[3];
    for (int j = 0; j < n; ++j) {
      auto p = packed(*ws[j], temp[j]);
      if (!p.ok()) return p.error();
      jobs[j] = {*p, outs[j]};
    }
    cpu::matmul_many(pool_, jobs, n, x.data, x.rows);
    return Status::Ok();
  }

  // Runs fn(t) for every row, in parallel when the rows are many.
  template <class Fn>
  void for_rows(int64_t rows, int64_t cols, Fn&& fn) {
    if (rows * cols < 65536) {
      for (int64_t t = 0; t < rows; ++t) fn(t);
      return;
    }
    pool_.parallel_for(rows, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) fn(t);
    });
  }

  ThreadPool pool_;
  std::unordered_map<uint64_t, std::unique_ptr<cpu::PackedWeight>> packed_;  // by Weight::uid
  std::vector<float> kv_f32_;  // attention's fp32 copy of one layer's K/V
  std::vector<Buffer> slots_;
  std::vector<size_t> slot_sizes_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace kvscope
