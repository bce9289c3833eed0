// matmul.cpp — CPU matrix products on packed weights (see matmul.h).
//
// Work split: the 16-row groups of all jobs, concatenated, are cut into chunks of a few
// tiles that the pool's threads claim (thread_pool.h); each runs the active instruction
// set's kernel (kernels_impl.h) on its groups. For the panel kernel, x is transposed once here
// and shared by every chunk. Every output element is computed by one kernel call with a fixed
// arithmetic, so results do not depend on T or on the number of threads.
#include "engine/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "engine/cpu/kernels.h"

namespace kvscope::cpu {

void segment_sums(const float* x, int64_t T, int64_t n, float* sx) {
  const int64_t segs = n / kXSumValues;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < segs; ++s) {
      const float* v = x + t * n + s * kXSumValues;
      float sum = 0.0f;
      for (int k = 0; k < kXSumValues; ++k) sum += v[k];
      sx[t * segs + s] = sum;
    }
}

bool words_x(const float* x, int64_t T, int64_t n, float* xq) {
  // 2^-word_shift(p): multiplying by a power of two is exact while the result stays normal.
  static constexpr float kScale[8] = {1.0f,     0x1p-4f,  0x1p-8f,  0x1p-12f,
                                      0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
  // One pass without branches (it runs on one thread before every product of the decode
  // step); whether every value scaled exactly is known at the end.
  bool exact = true;
  for (int64_t i = 0; i < T * n; i += 8)
    for (int p = 0; p < 8; ++p) {
      const float v = x[i + p];
      exact &= !(v != 0.0f && std::fabs(v) < 0x1p-98f);
      xq[i + p] = v * kScale[p];
    }
  return exact;
}

namespace {
bool has_offsets(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
}

// -1: the CPU's default (rows_kernel_on); 0, 1: forced by set_rows_kernel.
std::atomic<int> g_rows_forced{-1};
}  // namespace

bool rows_kernel_on(Isa isa) {
  const int forced = g_rows_forced.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  return !(isa == Isa::Avx512 && amd_cpu_family() == 0x1A);
}

void set_rows_kernel(std::optional<bool> on) {
  g_rows_forced.store(on ? int(*on) : -1, std::memory_order_relaxed);
}

void matmul_many(ThreadPool& pool, const MatmulJob* jobs, int n_jobs, const float* x, int64_t T) {
  const IsaKernels& k = kernels(isa_active());
  int64_t total = 0, work = 0;
  for (int j = 0; j < n_jobs; ++j) {
    total += jobs[j].w->groups;
    work += jobs[j].w->n_in * jobs[j].w->n_out * T;
  }
  // Every job reads the same x, so the jobs share one n_in.
  const float* xt = nullptr;
  bool panel = false;  // whether a job takes the panel path, which reads x transposed
  for (int j = 0; j < n_jobs; ++j) panel = panel || k.uses_panel(jobs[j].w->type, T);
  if (panel) {
    thread_local std::vector<float> buf;
    const int64_t n = jobs[0].w->n_in;
    if (buf.size() < size_t(k.xt_floats(T, n))) buf.resize(size_t(k.xt_floats(T, n)));
    // Tiles are independent (tile i at xt + i·n·tile_t): split over the threads.
    const int64_t tiles = (T + k.tile_t - 1) / k.tile_t;
    float* out = buf.data();
    auto transpose = [&](int64_t b, int64_t e) {
      const int64_t t0 = b * k.tile_t, t1 = std::min(T, e * k.tile_t);
      k.transpose_x(x + t0 * n, t1 - t0, n, out + b * n * k.tile_t);
    };
    if (T * n < 65536) {
      transpose(0, tiles);
    } else {
      pool.parallel_for(tiles, transpose);
    }
    xt = buf.data();
  }
  // The segment sums, where a job's type has offsets (every job reads the same x), and x
  // interleaved for the rows kernel, where a job takes it (which makes the sums too).
  const bool rows_on = rows_kernel_on(k.isa);
  auto takes_rows = [&](const PackedWeight& w) { return rows_on && k.uses_rows(w.type, T); };
  bool offsets = false, rows = false;
  for (int j = 0; j < n_jobs; ++j) {
    offsets = offsets || has_offsets(jobs[j].w->type);
    rows = rows || takes_rows(*jobs[j].w);
  }
  const int64_t n_in = jobs[0].w->n_in;
  float* sx = nullptr;
  if (offsets) {
    thread_local std::vector<float> sbuf;
    const int64_t want = T * (n_in / kXSumValues);
    if (sbuf.size() < size_t(want)) sbuf.resize(size_t(want));
    sx = sbuf.data();
  }
  const float* xi = nullptr;
  if (rows) {
    thread_local std::vector<float> ibuf;
    const size_t want = size_t((T + k.slice_t - 1) / k.slice_t * k.slice_t * n_in);
    if (ibuf.size() < want) ibuf.resize(want);
    k.interleave_x(x, T, n_in, ibuf.data(), sx);
    xi = ibuf.data();
  } else if (sx) {
    segment_sums(x, T, n_in, sx);
  }
  // x pre-scaled for the gemv tiles on Words-ordered weights (kernels.h, word_shift).
  const float* xq = nullptr;
  bool words = false;
  for (int j = 0; j < n_jobs; ++j)
    words = words || (jobs[j].w->nibbles == NibbleOrder::Words &&
                      !k.uses_panel(jobs[j].w->type, T) && !takes_rows(*jobs[j].w));
  if (words) {
    thread_local std::vector<float> qbuf;
    if (qbuf.size() < size_t(T * n_in)) qbuf.resize(size_t(T * n_in));
    if (words_x(x, T, n_in, qbuf.data())) xq = qbuf.data();
  }
  const MatmulX in{x, xt, sx, T, xi, xq};
  auto run = [&](int64_t b, int64_t e) {
    int64_t base = 0;
    for (int j = 0; j < n_jobs && b < e; ++j) {
      const int64_t n = jobs[j].w->groups;
      const int64_t lo = std::max(b, base), hi = std::min(e, base + n);
      if (lo < hi) k.matmul_groups(*jobs[j].w, lo - base, hi - base, in, jobs[j].out);
      base += n;
    }
  };
  if (work < 32768) {  // small products are not worth waking the pool for
    run(0, total);
    return;
  }
  // Chunks of whole register tiles (4 groups: two AVX-512 panel tiles, one gemv step).
  pool.parallel_for(total, run, 4);
}

void matmul(ThreadPool& pool, const PackedWeight& w, const float* x, int64_t T, float* out) {
  const MatmulJob job{&w, out};
  matmul_many(pool, &job, 1, x, T);
}

}  // namespace kvscope::cpu
