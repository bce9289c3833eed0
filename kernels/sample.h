// sample.h — host entry point of the device sampler (kernels/sample.cu); plain C++.
//
// For one logits row [V] on the device it finds, without sending the row to the host:
//   - the n best ids by (logit descending, id ascending): the order of the probabilities
//     after temperature, up to ties that rounding creates among different logits (the
//     host re-sorts them by the exact probabilities: engine/device_sampling.h);
//   - max = the largest logit (the first candidate's), as the CPU's softmax subtracts it;
//   - sum = sum over i of float(exp((l_i - max) / T)), in double, and sum_err, a bound on
//     how far the host's sum of the same terms (softmax_with_temperature: expf, summed in
//     index order in double) can be from it. Each term is float(x) of x = exp((double)t),
//     t = (l_i - max) / T in float as on the host (IEEE subtract and divide: the same t).
//     That is the correctly rounded expf(t) unless exp(t) lies within 2^-8 ulp of a
//     rounding midpoint, where the host's expf (glibc: at most 0.502 ulp) may round the
//     other way: such a term adds the spacing to that other float to sum_err. Terms
//     under FLT_MIN add 2^-148 each. The summation orders differ by at most V·2^-52·sum, added too.
//   - nan: how many logits are NaN (the host then takes the full row).
// The out buffer holds a SampleHeader, then int32 ids[n], then float logits[n].
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvscope::cuda {

struct SampleHeader {
  double sum = 0;
  double sum_err = 0;
  float max = 0;
  int n = 0;    // candidates written (min(n, V))
  int nan = 0;  // NaN logits seen
  int pad = 0;
};
inline constexpr int kSampleMaxCandidates = 256;

// Bytes of the out buffer for n candidates, and of the work buffer for a row of V.
inline size_t sample_out_bytes(int n) {
  return sizeof(SampleHeader) + size_t(n) * 8;
}
size_t sample_work_bytes(int V, int n);

// logits [V] (device), 1 <= n <= kSampleMaxCandidates, temperature > 0 (the CPU's softmax
// uses 1 for greedy). row_copy [V] receives a copy of the row (the logits the host may
// ask for later); work and out as sized above. Three launches.
cudaError_t sample_candidates(const float* logits, int V, int n, float temperature, float* row_copy,
                              void* work, void* out, cudaStream_t s);

// The same for `rows` rows of logits [rows][V] at once (one grid row of blocks each, still
// three launches): row r's results at out + r * sample_out_bytes(n), its work at work + r *
// sample_row_work_bytes(V, n); no row copy (row_copy must be null unless rows is 1). Each
// row's results are those sample_candidates gives for that row alone, bit for bit.
size_t sample_row_work_bytes(int V, int n);
cudaError_t sample_candidates_rows(const float* logits, int rows, int V, int n, float temperature,
                                   float* row_copy, void* work, void* out, cudaStream_t s);

}  // namespace kvscope::cuda
