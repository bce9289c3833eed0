// sample.cu — the device sampler's reductions over one logits row (see kernels/sample.h):
// the n best (logit, id) pairs, the max and the softmax sum with its error bound.
// Thread mapping: sample_partial_kernel, one block of 256 threads per chunk of 4096
// logits (held in shared memory), n rounds of a block-wide arg-best, each round taking the
// best pair after the previous round's winner; sample_finish_kernel, one block of 256
// threads: the same rounds over every chunk's n pairs, then one strided pass over the row
// for the sum (double exp, so that each term is the correctly rounded expf) and a tree
// reduction in double.
#include <cfloat>
#include <cmath>

#include "kernels/launch.cuh"
#include "kernels/sample.h"

namespace kvscope::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 4096;

// (al, aid) comes before (bl, bid): logit descending, then id ascending; id < 0 is an
// empty entry, after everything.
__device__ __forceinline__ bool before(float al, int aid, float bl, int bid) {
  if (aid < 0) return false;
  if (bid < 0) return true;
  return al > bl || (al == bl && aid < bid);
}

// n rounds of a block-wide arg-best over count entries, get(j, l, id) reading entry j:
// round r writes the r-th pair in order to out_id[r], out_l[r] (id -1 once none is left).
// Every thread of the block calls it; red_l, red_id are kThreads entries of shared memory.
template <class Get>
__device__ void block_select(Get get, int count, int n, int* out_id, float* out_l, float* red_l,
                             int* red_id) {
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
    red_l[threadIdx.x] = bl;
    red_id[threadIdx.x] = bid;
    __syncthreads();
    for (int o = static_cast<int>(blockDim.x) / 2; o > 0; o >>= 1) {
      const int t = static_cast<int>(threadIdx.x);
      if (t < o && before(red_l[t + o], red_id[t + o], red_l[t], red_id[t])) {
        red_l[t] = red_l[t + o];
        red_id[t] = red_id[t + o];
      }
      __syncthreads();
    }
    pl = red_l[0];
    pid = red_id[0];
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

__global__ void sample_partial_kernel(const float* logits, int V, int n, float* row_copy,
                                      int* part_id, float* part_l) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float vals[kChunk];
  __shared__ float red_l[kThreads];
  __shared__ int red_id[kThreads];
  const int base = static_cast<int>(blockIdx.x) * kChunk;
  const int count = V - base < kChunk ? V - base : kChunk;
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    const float v = logits[base + j];
    vals[j] = v;
    row_copy[base + j] = v;
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

__global__ void sample_finish_kernel(const float* logits, int V, int n, int n_part,
                                     const int* part_id, const float* part_l, float temperature,
                                     SampleHeader* hdr, int* ids, float* out_l) {
  grid_dependency_wait();  // before any global memory access (PDL: cuda_compat.cuh)
  grid_dependents_launch();
  __shared__ float red_l[kThreads];
  __shared__ int red_id[kThreads];
  __shared__ double red_s[kThreads], red_e[kThreads];
  __shared__ int red_n[kThreads];
  block_select(
      [&](int j, float& l, int& id) {
        l = part_l[j];
        id = part_id[j];
      },
      n_part * n, n, ids, out_l, red_l, red_id);
  __syncthreads();  // thread 0's writes of ids, out_l are visible to the block
  const float mx = out_l[0];
  double sum = 0.0, err = 0.0;
  int nan = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
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
  const int tid = static_cast<int>(threadIdx.x);
  red_s[tid] = sum;
  red_e[tid] = err;
  red_n[tid] = nan;
  __syncthreads();
  for (int o = static_cast<int>(blockDim.x) / 2; o > 0; o >>= 1) {
    if (tid < o) {
      red_s[tid] += red_s[tid + o];
      red_e[tid] += red_e[tid + o];
      red_n[tid] += red_n[tid + o];
    }
    __syncthreads();
  }
  if (tid == 0) {
    SampleHeader h;
    h.sum = red_s[0];
    // Both sums of V positive terms are within (V - 1)·2^-53·sum of the exact one.
    h.sum_err = red_e[0] + static_cast<double>(V) * 0x1p-51 * red_s[0];
    h.max = mx;
    h.n = n < V ? n : V;
    h.nan = red_n[0];
    *hdr = h;
  }
}

int n_chunks(int V) {
  return (V + kChunk - 1) / kChunk;
}

}  // namespace

size_t sample_work_bytes(int V, int n) {
  return size_t(n_chunks(V)) * size_t(n) * 8;
}

cudaError_t sample_candidates(const float* logits, int V, int n, float temperature, float* row_copy,
                              void* work, void* out, cudaStream_t s) {
  if (V <= 0 || n < 1 || n > kSampleMaxCandidates || !(temperature > 0))
    return cudaErrorInvalidValue;
  const int chunks = n_chunks(V);
  int* part_id = static_cast<int*>(work);
  float* part_l = reinterpret_cast<float*>(part_id + int64_t(chunks) * n);
  auto* hdr = static_cast<SampleHeader*>(out);
  int* ids = reinterpret_cast<int*>(hdr + 1);
  float* out_l = reinterpret_cast<float*>(ids + n);
  cudaError_t e = launch(sample_partial_kernel, dim3(chunks), dim3(kThreads), 0, s, logits, V, n,
                         row_copy, part_id, part_l);
  if (e != cudaSuccess) return e;
  return launch(sample_finish_kernel, dim3(1), dim3(kThreads), 0, s, logits, V, n, chunks,
                static_cast<const int*>(part_id), static_cast<const float*>(part_l), temperature,
                hdr, ids, out_l);
}

}  // namespace kvscope::cuda
