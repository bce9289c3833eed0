// cpu_backend.cpp — Backend ops on the CPU. Tensors are host memory; the KV cache is
// per layer K and V, each [Hkv][n_slots][D] in its K / V type (f16 or f32), slots mapped
// to positions by the engine's KvCache. Loops over rows/heads are
// split across the thread pool; each output element is written by one thread, so
// results do not depend on the thread count.
#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "engine/cpu/attention.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/cpu_kv_cache.h"
#include "engine/cpu/elementwise.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/matmul.h"
#include "engine/cpu/packed_weight.h"
#include "engine/cpu/thread_pool.h"
#include "engine/gguf.h"
#include "engine/quant.h"

namespace kvscope {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads)
      : pool_(n_threads), rows_workers_(std::make_unique<RowsWorker[]>(size_t(pool_.size()))) {}
  const std::string& start_error() const { return pool_.start_error(); }

  std::string name() const override {
    return "cpu (" + std::to_string(pool_.size()) + (pool_.size() == 1 ? " thread, " : " threads, ") +
           cpu::isa_name(cpu::isa_active()) + ")";
  }
  const char* kind() const override { return "cpu"; }
  int threads() const override { return pool_.size(); }
  void host_parallel(int64_t n, const std::function<void(int64_t, int64_t)>& fn) override {
    pool_.parallel_for(n, [&](int64_t b, int64_t e) { fn(b, e); });
  }

  // Ops. Their arguments were checked by Backend's wrappers (engine/backend.cpp).
  Expected<Tensor> do_scratch(int slot, int64_t rows, int64_t cols) override {
    if (size_t(slot) >= slots_.size()) {
      slots_.resize(size_t(slot) + 1);
      slot_sizes_.resize(size_t(slot) + 1, 0);
    }
    size_t need = size_t(rows * cols) * sizeof(float);
    if (need > slot_sizes_[size_t(slot)]) {
      // Half as much again as asked for: a slot that grows by a row per step (the
      // attention rows of decode, one column more each step) is then reallocated — and
      // its fresh pages faulted in — a few times per run, not at every step.
      need = std::max(need, slot_sizes_[size_t(slot)] + slot_sizes_[size_t(slot)] / 2);
      slots_[size_t(slot)] = cpu::alloc_bytes(need);
      if (!slots_[size_t(slot)]) return make_error("cpu: out of memory allocating ", need, " bytes");
      slot_sizes_[size_t(slot)] = need;
    }
    return Tensor{reinterpret_cast<float*>(slots_[size_t(slot)].get()), rows, cols};
  }

  Expected<std::unique_ptr<KvCache>> do_create_kv_cache(const KvCacheConfig& config,
                                                        int capacity) override {
    return cpu::CpuKvCache::create(config, capacity);
  }

  std::optional<double> products_in_cache_ms(const std::vector<const Weight*>& weights,
                                             int rows) override {
    if (rows < 1) return std::nullopt;
    // Half of each thread's L2 for its share of a part (1 MiB where the system does not say).
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const uint64_t part_bytes = uint64_t(l2 > 0 ? l2 : 1 << 20) / 2 * uint64_t(pool_.size());
    std::vector<float> x, out;
    double total = 0;
    for (const Weight* w : weights) {
      std::unique_ptr<cpu::PackedWeight> temp;
      auto p = packed(*w, temp);
      if (!p.ok()) return std::nullopt;
      const cpu::PackedWeight& full = **p;
      // The first groups, read in place: a view with no deleter of its own.
      cpu::PackedWeight part;
      part.type = full.type;
      part.n_in = full.n_in;
      part.nibbles = full.nibbles;
      part.group_bytes = full.group_bytes;
      part.groups = std::clamp<int64_t>(int64_t(part_bytes / full.group_bytes), 1, full.groups);
      part.n_out = std::min(full.n_out, part.groups * cpu::kPackRows);
      part.data = {const_cast<uint8_t*>(full.group(0)), [](void*) {}};
      if (x.size() < size_t(rows * full.n_in)) {
        x.resize(size_t(rows * full.n_in));
        for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * float(int(i % 13) - 6);
      }
      if (out.size() < size_t(rows * part.n_out)) out.resize(size_t(rows * part.n_out));
      // Passes of about 4 MB of weight bytes a row each (at least one product), after two
      // warm-up products that bring the part into the caches; the best pass counts.
      const uint64_t bytes = uint64_t(part.groups) * part.group_bytes;
      const int reps = int(std::clamp<uint64_t>((uint64_t(4) << 20) / bytes / uint64_t(rows), 1, 256));
      for (int i = 0; i < 2; ++i) cpu::matmul(pool_, part, x.data(), rows, out.data());
      double best = 1e30;
      for (int pass = 0; pass < 7; ++pass) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) cpu::matmul(pool_, part, x.data(), rows, out.data());
        const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
        best = std::min(best, dt.count() / reps);
      }
      total += best * double(full.groups) / double(part.groups);
    }
    return total;
  }
  Expected<std::shared_ptr<KvPool>> create_kv_pool(const KvPoolConfig& config) override {
    return cpu::CpuKvPool::create(config);
  }
  Expected<std::unique_ptr<KvCache>> create_paged_kv_cache(const KvCacheConfig& config,
                                                           std::shared_ptr<KvPool> pool) override {
    if (!dynamic_cast<const cpu::CpuKvPool*>(pool.get()))
      return make_error("cpu: a paged cache needs a pool made by the cpu backend");
    return cpu::CpuKvCache::create_paged(config, std::move(pool));
  }

  Status do_embed(const Weight& tok_embd, const int32_t* ids, float scale, Tensor out) override {
    const cpu::IsaKernels& k = cpu::kernels(cpu::isa_active());
    for (int64_t t = 0; t < out.rows; ++t) {
      float* row = out.data + t * out.cols;
      k.dequantize_row(tok_embd.type, tok_embd.data + uint64_t(ids[t]) * tok_embd.row_bytes, row,
                       out.cols);
      if (scale != 1.0f)
        for (int64_t i = 0; i < out.cols; ++i) row[i] *= scale;
    }
    return Status::Ok();
  }

  Status do_add_bias(Tensor x, const Weight& b) override {
    cpu::add_bias(x.data, x.rows, x.cols, reinterpret_cast<const float*>(b.data));
    return Status::Ok();
  }

  // Each row's sum of squares is added in order, in double. One row's chain of adds waits
  // on each add's latency, so whole groups of kNormRows rows go together: their chains
  // are independent and overlap, and every row's arithmetic stays the same (a batch of
  // decode rows is normed in half the time it takes row by row).
  static constexpr int kNormRows = 4;
  Status do_rmsnorm(Tensor x, const Weight& w, float eps, Tensor out) override {
    const float* g = reinterpret_cast<const float*>(w.data);
    const int64_t C = x.cols;
    const auto scale_rows = [&](int64_t t0, int n, const double* ss) {
      for (int r = 0; r < n; ++r) {
        const float* xr = x.data + (t0 + r) * C;
        float* o = out.data + (t0 + r) * C;
        const float scale = float(1.0 / std::sqrt(ss[r] / double(C) + double(eps)));
        for (int64_t i = 0; i < C; ++i) o[i] = xr[i] * scale * g[i];
      }
    };
    const int64_t groups = x.rows / kNormRows;
    for_rows(groups, C * kNormRows, [&](int64_t q) {
      const int64_t t0 = q * kNormRows;
      const float* xr[kNormRows];
      double ss[kNormRows];
      for (int r = 0; r < kNormRows; ++r) {
        xr[r] = x.data + (t0 + r) * C;
        ss[r] = 0;
      }
      for (int64_t i = 0; i < C; ++i)
        for (int r = 0; r < kNormRows; ++r) ss[r] += double(xr[r][i]) * xr[r][i];
      scale_rows(t0, kNormRows, ss);
    });
    for (int64_t t = groups * kNormRows; t < x.rows; ++t) {
      const float* xr = x.data + t * C;
      double ss = 0;
      for (int64_t i = 0; i < C; ++i) ss += double(xr[i]) * xr[i];
      scale_rows(t, 1, &ss);
    }
    return Status::Ok();
  }

  Status do_matmul(const Weight& w, Tensor x, Tensor out) override {
    const Weight* ws[1] = {&w};
    float* outs[1] = {out.data};
    return matmul_jobs(ws, outs, 1, x);
  }

  Status do_matmul_qkv(const Weight& wq, const Weight& wk, const Weight& wv, Tensor x, Tensor q,
                       Tensor k, Tensor v) override {
    const Weight* ws[3] = {&wq, &wk, &wv};
    float* outs[3] = {q.data, k.data, v.data};
    return matmul_jobs(ws, outs, 3, x);
  }

  Status do_matmul_glu(const Weight& w_gate, const Weight& w_up, Tensor x, FfnAct act,
                       Tensor out, Tensor up) override {
    const Weight* ws[2] = {&w_gate, &w_up};
    float* outs[2] = {out.data, up.data};
    KV_TRY(matmul_jobs(ws, outs, 2, x));
    return do_glu(out, up, act, out);
  }

  Status do_rope(Tensor x, int n_heads, int head_dim, const RopeSpec& r, int pos0) override {
    const float* cs = rope_table_.angles(r.n_rot, r.base, r.freq_scale, pos0, x.rows);
    if (!cs) {  // positions past the table
      cpu::rope_rows(x.data, x.rows, n_heads, head_dim, r.style, r.n_rot, r.base, r.freq_scale,
                     pos0);
      return Status::Ok();
    }
    for_rows(x.rows, x.cols, [&](int64_t t) {
      cpu::rope_apply(x.data + t * x.cols, 1, n_heads, head_dim, r.style, r.n_rot, cs + t * r.n_rot);
    });
    return Status::Ok();
  }

  Status do_kv_write(KvCache& cache, int layer, Tensor k, Tensor v, int pos0) override {
    auto& c = static_cast<cpu::CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    for (int64_t t = 0; t < k.rows; ++t) {
      const int slot = c.slot_of(layer, int(pos0 + t));
      for (int h = 0; h < Hkv; ++h) {
        cpu::store_row(c.types().k, k.data + t * k.cols + h * D, c.k_row(layer, h, slot), D);
        cpu::store_row(c.types().v, v.data + t * v.cols + h * D, c.v_row(layer, h, slot), D);
      }
    }
    return Status::Ok();
  }

  Status do_attention(Tensor q, const KvCache& cache, int layer, int pos0, int n_head,
                      float scale, Tensor out, Tensor probs_last) override {
    return cpu::attention(pool_, q, static_cast<const cpu::CpuKvCache&>(cache), layer, pos0,
                          n_head, scale, out, probs_last, attention_scratch_);
  }

  // A batch of decode rows, one query per sequence: each sequence alone has too little
  // attention to split over the threads (a few chunks), so the threads take whole
  // sequences instead, one parallel region for the batch. A query's arithmetic does not
  // depend on the split (attention.cpp), so the rows are those of attention() alone.
  Status do_attention_rows(Tensor q, const DecodeRows& rows, int layer, int n_head, float scale,
                           Tensor out) override {
    if (rows.n < 2 * pool_.size())
      return Backend::do_attention_rows(q, rows, layer, n_head, scale, out);
    std::mutex failed_at;
    Status failed = Status::Ok();
    pool_.parallel_for(rows.n, [&](int64_t b, int64_t e) {
      RowsWorker& w = claim_rows_worker();
      for (int64_t i = b; i < e; ++i) {
        Status st = cpu::attention(w.alone, q.row(i),
                                   static_cast<const cpu::CpuKvCache&>(*rows.caches[i]), layer,
                                   rows.pos[i], n_head, scale, out.row(i), Tensor{}, w.scratch);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(failed_at);
          if (failed.ok()) failed = std::move(st);
        }
      }
      w.busy.store(false, std::memory_order_release);
    });
    return failed;
  }

  Status do_glu(Tensor gate, Tensor up, FfnAct act, Tensor out) override {
    const int64_t C = gate.cols;
    const cpu::IsaKernels& k = cpu::kernels(cpu::isa_active());
    for_rows(gate.rows, C, [&](int64_t t) {
      if (act == FfnAct::Silu) {
        k.silu_glu(gate.data + t * C, up.data + t * C, C, out.data + t * C);
      } else {
        cpu::gelu_glu(gate.data + t * C, up.data + t * C, C, out.data + t * C);
      }
    });
    return Status::Ok();
  }

  Status do_add(Tensor x, Tensor y) override {
    const int64_t C = x.cols;
    for_rows(x.rows, C, [&](int64_t t) {
      float* a = x.data + t * C;
      const float* b = y.data + t * C;
      for (int64_t i = 0; i < C; ++i) a[i] += b[i];
    });
    return Status::Ok();
  }

  Status do_kv_row_norms(const KvCache& cache, int layer, int pos0, int T, Tensor k_norm,
                         Tensor v_norm) override {
    const auto& c = static_cast<const cpu::CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    for_rows(T, int64_t(2) * Hkv * D, [&](int64_t t) {
      thread_local std::vector<float> row;
      row.resize(size_t(D));
      const int s = c.slot_of(layer, int(pos0 + t));
      double sk = 0, sv = 0;
      for (int h = 0; h < Hkv; ++h) {
        cpu::load_row(c.types().k, c.k_row(layer, h, s), row.data(), D);
        for (float f : row) sk += double(f) * f;
        cpu::load_row(c.types().v, c.v_row(layer, h, s), row.data(), D);
        for (float f : row) sv += double(f) * f;
      }
      k_norm.data[t] = float(std::sqrt(sk));
      v_norm.data[t] = float(std::sqrt(sv));
    });
    return Status::Ok();
  }

  bool can_measure_kv_errors() const override { return true; }
  Status do_kv_row_errors(const KvCache& cache, int layer, int pos0, Tensor k, Tensor v,
                          Tensor k_err, Tensor v_err) override {
    const auto& c = static_cast<const cpu::CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    thread_local std::vector<float> row;  // kept from step to step: a step allocates nothing
    row.resize(size_t(D));
    auto rel = [](double diff, double ref) {
      return ref > 0 ? float(std::sqrt(diff / ref)) : 0.0f;
    };
    for (int t = 0; t < int(k.rows); ++t) {
      const int s = c.slot_of(layer, pos0 + t);
      double dk = 0, rk = 0, dv = 0, rv = 0;
      for (int h = 0; h < Hkv; ++h) {
        const float* xk = k.data + int64_t(t) * k.cols + int64_t(h) * D;
        const float* xv = v.data + int64_t(t) * v.cols + int64_t(h) * D;
        cpu::load_row(c.types().k, c.k_row(layer, h, s), row.data(), D);
        for (int i = 0; i < D; ++i) {
          dk += double(xk[i] - row[size_t(i)]) * (xk[i] - row[size_t(i)]);
          rk += double(xk[i]) * xk[i];
        }
        cpu::load_row(c.types().v, c.v_row(layer, h, s), row.data(), D);
        for (int i = 0; i < D; ++i) {
          dv += double(xv[i] - row[size_t(i)]) * (xv[i] - row[size_t(i)]);
          rv += double(xv[i]) * xv[i];
        }
      }
      k_err.data[t] = rel(dk, rk);
      v_err.data[t] = rel(dv, rv);
    }
    return Status::Ok();
  }

  Status do_kv_rerotate(KvCache& cache, int layer, const RopeSpec& r, int first,
                        int delta) override {
    auto& c = static_cast<cpu::CpuKvCache&>(cache);
    const int D = c.shape().head_dim, Hkv = c.shape().n_head_kv;
    std::vector<float> row(static_cast<size_t>(D));
    const auto& pos = c.slot_pos(layer);
    for (int s = 0; s < c.n_slots(layer); ++s) {
      if (pos[size_t(s)] < first) continue;  // empty (-1) or before the moved range
      for (int h = 0; h < Hkv; ++h) {
        uint8_t* k = c.k_row(layer, h, s);
        cpu::load_row(c.types().k, k, row.data(), D);
        cpu::rope_rows(row.data(), 1, 1, D, r.style, r.n_rot, r.base, r.freq_scale, delta);
        cpu::store_row(c.types().k, row.data(), k, D);
      }
    }
    return Status::Ok();
  }

  Status do_download(Tensor src, float* host) override {
    if (src.size() > 0) std::memcpy(host, src.data, size_t(src.size()) * sizeof(float));
    return Status::Ok();
  }

  // Not fused on the CPU: the composition of the basic ops.
  Status do_rope_kv_write(Tensor q, Tensor k, Tensor v, KvCache& cache, int layer, int n_head,
                          const RopeSpec& r, int pos0) override {
    return unfused_rope_kv_write(q, k, v, cache, layer, n_head, r, pos0);
  }
  Status do_add_rmsnorm(Tensor x, Tensor y, const Weight& w, float eps, Tensor out) override {
    return unfused_add_rmsnorm(x, y, w, eps, out);
  }
  Status do_norm_qkv_kv_write(const ResidualNorm& rn, const QkvStore& a) override {
    return unfused_norm_qkv_kv_write(rn, a);
  }
  Status do_norm_ffn(const ResidualNorm& rn, const FfnWeights& w, Tensor gate, Tensor up,
                     Tensor out) override {
    return unfused_norm_ffn(rn, w, gate, up, out);
  }

 private:
  // The packed copy of w (engine/cpu/packed_weight.h), made on first use and kept for
  // the backend's lifetime (the weight's file pages are then released); a weight without
  // a uid is packed into `temp` for this call.
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
      // The packed copy is what the products read from now on: the file's pages of this
      // weight need not stay resident too (they are read again if something else needs them).
      gguf_release_pages(w.data, w.row_bytes * uint64_t(w.n_out));
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

  // What one chunk of do_attention_rows works with: a pool of one (every loop of the
  // chunk's attention calls runs on the thread that runs the chunk) and its scratch. One
  // per thread of pool_, owned by the backend (freed with it, whichever threads ran them);
  // a chunk claims a free one, and no more chunks than pool_.size() run at once.
  struct RowsWorker {
    std::atomic<bool> busy{false};
    ThreadPool alone{1};
    cpu::AttentionScratch scratch;
  };
  RowsWorker& claim_rows_worker() {
    for (;;)
      for (int i = 0; i < pool_.size(); ++i)
        if (!rows_workers_[size_t(i)].busy.exchange(true, std::memory_order_acquire))
          return rows_workers_[size_t(i)];
  }

  ThreadPool pool_;
  std::unique_ptr<RowsWorker[]> rows_workers_;  // [pool_.size()]
  std::unordered_map<uint64_t, std::unique_ptr<cpu::PackedWeight>> packed_;  // by Weight::uid
  cpu::AttentionScratch attention_scratch_;
  cpu::RopeTable rope_table_;
  std::vector<cpu::Buffer> slots_;
  std::vector<size_t> slot_sizes_;
};

}  // namespace

Expected<std::unique_ptr<Backend>> create_cpu_backend(int n_threads, std::string* notice) {
  const int hw = hardware_threads();
  if (n_threads <= 0) {
    n_threads = hw;
  } else if (n_threads > hw) {
    if (notice)
      *notice = std::to_string(n_threads) + " CPU threads requested but this machine runs " +
                std::to_string(hw) + " at once; using " + std::to_string(hw);
    n_threads = hw;
  }
  auto backend = std::make_unique<CpuBackend>(n_threads);
  if (!backend->start_error().empty())
    return make_error("cpu: ", backend->start_error(),
                      "; ask for fewer threads (--threads) or free system resources");
  return std::unique_ptr<Backend>(std::move(backend));
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads <= 0 ? hardware_threads() : n_threads);
}

}  // namespace kvscope
