// sample.cu — the device sampler's reductions over one logits row (see kernels/sample.h):
// the n best (logit, id) pairs, the max and the softmax sum with its error bound.
// Three launches, each wide enough that no one block walks the whole row:
//   sample_partial_kernel: one block of 256 threads per chunk of 4096 logits (held in
//     shared memory), n rounds of a block-wide arg-best, each round taking the best pair
//     after the previous round's winner; it also copies the row;
//   sample_sum_kernel: one block of 256 threads per span of 1024 logits; the max is the
//     best of the chunks' winners (every block finds it), then the span's sum of terms
//     (double exp, so that each term is the correctly rounded expf), its error terms and
//     NaN count, reduced by a fixed tree into one entry per span;
//   sample_finish_kernel: one block, the same rounds over every chunk's n pairs, and the
//     spans' entries summed by a fixed tree (deterministic: no float atomics).
// Several rows at once (sample_candidates_rows): each kernel's grid has a row of blocks per
// logits row, each row with its own work and results; a row's arithmetic is its own.
// An arg-best round reduces within each warp by shuffles, then over the warps' winners:
// two barriers a round.
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "kernels/launch.cuh"
#include "kernels/sample.h"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;
constexpr int kSpan = 1024;  // logits per block of sample_sum_kernel

// (al, aid) comes before (bl, bid): logit descending, then id ascending; id < 0 is an
// empty entry, after everything.
__device__ __forceinline__ bool before(float al, int aid, float bl, int bid) {
  if (aid < 0) return false;
  if (bid < 0) return true;
  return al > bl || (al == bl && aid < bid);
}

// The better of (l, id) and the pair `o` lanes away, for every lane (a total order:
// ids differ, so every lane ends with the same winner whatever the tree).
__device__ __forceinline__ void warp_best(float& l, int& id) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ol = __shfl_xor_sync(kFullMask, l, o);
    const int oid = __shfl_xor_sync(kFullMask, id, o);
    if (before(ol, oid, l, id)) {
      l = ol;
      id = oid;
    }
  }
}

// n rounds of a block-wide arg-best over count entries, get(j, l, id) reading entry j:
// round r writes the r-th pair in order to out_id[r], out_l[r] (id -1 once none is left).
// Every thread of the block calls it (blockDim.x a multiple of 32, at most kThreads);
// red_l, red_id are 32 entries of shared memory.
template <class Get>
__device__ void block_select(Get get, int count, int n, int* out_id, float* out_l, float* red_l,
                             int* red_id) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  float pl = 0.0f;
  int pid = -1;  // the previous round's winner (none yet)
  for (int r = 0; r < n; ++r) {
    float bl = 0.0f;
    int bid = -1;
    for (int j = threadIdx.x; j < count; j += blockDim.x) {
      float l;
      int id;
      get(j, l, id);
      if (id < 0 || (pid >= 0 && !before(pl, pid, l, id))) continue;
      if (before(l, id, bl, bid)) {
        bl = l;
        bid = id;
      }
    }
    warp_best(bl, bid);
    if (lane == 0) {
      red_l[warp] = bl;
      red_id[warp] = bid;
    }
    __syncthreads();
    bl = lane < n_warps ? red_l[lane] : 0.0f;
    bid = lane < n_warps ? red_id[lane] : -1;
    warp_best(bl, bid);
    pl = bl;
    pid = bid;
    if (threadIdx.x == 0) {
      out_id[r] = pid;
      out_l[r] = pl;
    }
    __syncthreads();  // red_ is written again by the next round
    if (pid < 0) {    // the same for every thread: nothing is left
      for (int q = r + 1 + static_cast<int>(threadIdx.x); q < n; q += blockDim.x) {
        out_id[q] = -1;
        out_l[q] = 0.0f;
      }
      return;
    }
  }
}

// Rows: blockIdx.y is the row; logits advance V floats a row, the work sample_row_work_bytes
// and the results sample_out_bytes (RowPtrs). row_copy is for a single row.
struct RowPtrs {
  int64_t V = 0;
  int64_t work_bytes = 0;  // row_work_bytes
  int64_t out_bytes = 0;   // sample_out_bytes
};
template <class P>
__device__ __forceinline__ P* at_row(P* base, int64_t bytes) {
  using B = typename std::conditional<std::is_const<P>::value, const char, char>::type;
  return reinterpret_cast<P*>(reinterpret_cast<B*>(base) + bytes * blockIdx.y);
}

__global__ void sample_partial_kernel(const float* logits, int V, int n, float* row_copy,
                                      int* part_id, float* part_l, RowPtrs rp) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  logits += rp.V * blockIdx.y;
  part_id = at_row(part_id, rp.work_bytes);
  part_l = at_row(part_l, rp.work_bytes);
  __shared__ float vals[kChunk];
  __shared__ float red_l[32];
  __shared__ int red_id[32];
  const int base = static_cast<int>(blockIdx.x) * kChunk;
  const int count = V - base < kChunk ? V - base : kChunk;
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    const float v = logits[base + j];
    vals[j] = v;
    if (row_copy) row_copy[base + j] = v;
  }
  __syncthreads();
  block_select(
      [&](int j, float& l, int& id) {
        l = vals[j];
        id = base + j;
      },
      count, n, part_id + static_cast<int64_t>(blockIdx.x) * n,
      part_l + static_cast<int64_t>(blockIdx.x) * n, red_l, red_id);
}

// How far the host's expf of the same argument may be from f = float(x), x = exp(t) in
// double (1 ulp of double: far below the window): 0 when x is clearly on one side of a
// rounding midpoint (both round to f), else the spacing to the float across that midpoint
// (expf may return either neighbour; sample.h).
__device__ __forceinline__ double term_err(double x, float f) {
  if (x < 0x1p-151) return 0.0;      // both give 0
  if (f < FLT_MIN) return 0x1p-148;  // subnormal: a couple of the smallest ulps
  const double r = x - static_cast<double>(f);
  const double side = r >= 0 ? static_cast<double>(nextafterf(f, FLT_MAX)) - f
                             : static_cast<double>(f) - nextafterf(f, 0.0f);
  return 0.5 * side - fabs(r) <= side * 0x1p-8 ? side : 0.0;
}

// Where sample_sum_kernel leaves one entry per span (after the chunks' pairs).
struct SpanSums {
  double* sum;
  double* err;
  int* nan;
};
__host__ __device__ inline SpanSums span_sums(void* work, int chunks, int n, int spans) {
  char* base = static_cast<char*>(work) + size_t(chunks) * size_t(n) * 8;
  SpanSums s;
  s.sum = reinterpret_cast<double*>(base);  // 8-byte aligned: chunks * n * 8 bytes before
  s.err = s.sum + spans;
  s.nan = reinterpret_cast<int*>(s.err + spans);
  return s;
}

// Sums a double per thread over the block by a fixed tree; thread 0 gets the total.
__device__ __forceinline__ double block_tree_sum(double v, double* red) {
  const int tid = static_cast<int>(threadIdx.x);
  red[tid] = v;
  __syncthreads();
  for (int o = static_cast<int>(blockDim.x) / 2; o > 0; o >>= 1) {
    if (tid < o) red[tid] += red[tid + o];
    __syncthreads();
  }
  const double total = red[0];
  __syncthreads();  // red is written again by the next call
  return total;
}

// The largest logit: the best of the chunks' first pairs (each chunk's own best), or 0
// when every logit is NaN (as an empty selection leaves it).
__device__ __forceinline__ float chunks_max(const int* part_id, const float* part_l, int n,
                                            int n_part) {
  float bl = 0.0f;
  int bid = -1;
  for (int c = 0; c < n_part; ++c) {
    const float l = part_l[int64_t(c) * n];
    const int id = part_id[int64_t(c) * n];
    if (before(l, id, bl, bid)) {
      bl = l;
      bid = id;
    }
  }
  return bl;
}

__global__ void __launch_bounds__(kThreads)
    sample_sum_kernel(const float* logits, int V, int n, int n_part, const int* part_id,
                      const float* part_l, float temperature, SpanSums out, RowPtrs rp) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  logits += rp.V * blockIdx.y;
  part_id = at_row(part_id, rp.work_bytes);
  part_l = at_row(part_l, rp.work_bytes);
  out.sum = at_row(out.sum, rp.work_bytes);
  out.err = at_row(out.err, rp.work_bytes);
  out.nan = at_row(out.nan, rp.work_bytes);
  __shared__ double red[kThreads];
  const float mx = chunks_max(part_id, part_l, n, n_part);
  const int base = static_cast<int>(blockIdx.x) * kSpan;
  const int end = V - base < kSpan ? V : base + kSpan;
  double sum = 0.0, err = 0.0;
  int nan = 0;
  for (int i = base + static_cast<int>(threadIdx.x); i < end; i += blockDim.x) {
    const float l = logits[i];
    if (l != l) {
      ++nan;
      continue;
    }
    const float t = (l - mx) / temperature;  // as softmax_with_temperature computes it
    const double x = exp(static_cast<double>(t));
    const float f = static_cast<float>(x);
    sum += static_cast<double>(f);
    err += term_err(x, f);
  }
  sum = block_tree_sum(sum, red);
  err = block_tree_sum(err, red);
  const double nans = block_tree_sum(static_cast<double>(nan), red);
  if (threadIdx.x == 0) {
    out.sum[blockIdx.x] = sum;
    out.err[blockIdx.x] = err;
    out.nan[blockIdx.x] = static_cast<int>(nans);
  }
}

__global__ void __launch_bounds__(kThreads)
    sample_finish_kernel(int V, int n, int n_part, const int* part_id, const float* part_l,
                         SpanSums spans, int n_spans, SampleHeader* hdr, int* ids, float* out_l,
                         RowPtrs rp) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  part_id = at_row(part_id, rp.work_bytes);
  part_l = at_row(part_l, rp.work_bytes);
  spans.sum = at_row(spans.sum, rp.work_bytes);
  spans.err = at_row(spans.err, rp.work_bytes);
  spans.nan = at_row(spans.nan, rp.work_bytes);
  hdr = at_row(hdr, rp.out_bytes);
  ids = at_row(ids, rp.out_bytes);
  out_l = at_row(out_l, rp.out_bytes);
  __shared__ float red_l[32];
  __shared__ int red_id[32];
  __shared__ double red[kThreads];
  block_select(
      [&](int j, float& l, int& id) {
        l = part_l[j];
        id = part_id[j];
      },
      n_part * n, n, ids, out_l, red_l, red_id);
  double sum = 0.0, err = 0.0, nan = 0.0;
  for (int b = threadIdx.x; b < n_spans; b += blockDim.x) {  // in span order per thread
    sum += spans.sum[b];
    err += spans.err[b];
    nan += spans.nan[b];
  }
  sum = block_tree_sum(sum, red);
  err = block_tree_sum(err, red);
  nan = block_tree_sum(nan, red);
  if (threadIdx.x == 0) {
    SampleHeader h;
    h.sum = sum;
    // Both sums of V positive terms are within (V - 1)·2^-53·sum of the exact one.
    h.sum_err = err + static_cast<double>(V) * 0x1p-51 * sum;
    h.max = out_l[0];  // thread 0 wrote it (block_select's first round)
    h.n = n < V ? n : V;
    h.nan = static_cast<int>(nan);
    *hdr = h;
  }
}

int n_chunks(int V) {
  return (V + kChunk - 1) / kChunk;
}

int n_spans(int V) {
  return (V + kSpan - 1) / kSpan;
}

}  // namespace

size_t sample_work_bytes(int V, int n) {
  return size_t(n_chunks(V)) * size_t(n) * 8 + size_t(n_spans(V)) * (8 + 8 + 4);
}

size_t sample_row_work_bytes(int V, int n) {
  return (sample_work_bytes(V, n) + 7) / 8 * 8;  // each row's doubles 8-byte aligned
}

cudaError_t sample_candidates_rows(const float* logits, int rows, int V, int n, float temperature,
                                   float* row_copy, void* work, void* out, cudaStream_t s) {
  if (V <= 0 || rows < 1 || rows > 65535 || n < 1 || n > kSampleMaxCandidates ||
      !(temperature > 0) || (row_copy && rows != 1))
    return cudaErrorInvalidValue;
  const int chunks = n_chunks(V), spans = n_spans(V);
  int* part_id = static_cast<int*>(work);
  float* part_l = reinterpret_cast<float*>(part_id + int64_t(chunks) * n);
  const SpanSums sums = span_sums(work, chunks, n, spans);
  auto* hdr = static_cast<SampleHeader*>(out);
  int* ids = reinterpret_cast<int*>(hdr + 1);
  float* out_l = reinterpret_cast<float*>(ids + n);
  const RowPtrs rp{V, int64_t(sample_row_work_bytes(V, n)), int64_t(sample_out_bytes(n))};
  const unsigned R = static_cast<unsigned>(rows);
  cudaError_t e = launch(sample_partial_kernel, dim3(chunks, R), dim3(kThreads), 0, s, logits, V, n,
                         row_copy, part_id, part_l, rp);
  if (e != cudaSuccess) return e;
  e = launch(sample_sum_kernel, dim3(spans, R), dim3(kThreads), 0, s, logits, V, n, chunks,
             static_cast<const int*>(part_id), static_cast<const float*>(part_l), temperature, sums,
             rp);
  if (e != cudaSuccess) return e;
  return launch(sample_finish_kernel, dim3(1, R), dim3(kThreads), 0, s, V, n, chunks,
                static_cast<const int*>(part_id), static_cast<const float*>(part_l), sums, spans,
                hdr, ids, out_l, rp);
}

cudaError_t sample_candidates(const float* logits, int V, int n, float temperature, float* row_copy,
                              void* work, void* out, cudaStream_t s) {
  if (!row_copy) return cudaErrorInvalidValue;
  return sample_candidates_rows(logits, 1, V, n, temperature, row_copy, work, out, s);
}

}  // namespace kvscope::cuda
