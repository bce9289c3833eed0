// device_sampling.h — the host half of sampling on the device. Backend::sample_candidates
// finds, where the logits row lives, its n best ids by (logit descending, id ascending),
// the max logit and the softmax sum with an error bound (kernels/sample.h); from those
// alone this file gives the session what the CPU path computes from the whole row —
// the top candidates with their probabilities, in the same order, and the sampled id of
// Sampler::sample for the same generator state — or says it cannot, and the session
// downloads the row and runs the CPU path for that step.
//
// Why the results are the CPU's, bit for bit:
//  1. Probabilities. softmax_with_temperature gives id i p_i = softmax_term(l_i, max, T) *
//     inv, inv = float(1 / S), S the double sum of every term. The host computes each
//     candidate's term itself (same function, same operands: the max is a logit). S is
//     known only to within sum ± sum_err, but float(1 / S) is monotone in S: when both
//     ends of the interval give the same float, that float is the CPU's inv. Otherwise
//     (the interval straddles a rounding boundary of inv: rare, about V·2^-51 / 2^-24 of
//     the time) it cannot decide.
//  2. Order. p is non-decreasing in the logit, so an id outside the candidates has p at
//     most that of the device's last candidate, p_last. The candidates re-sorted by
//     (p descending, id ascending) are the CPU's order for every entry with p > p_last
//     (the verified prefix, M entries); entries equal to p_last may trail ids outside.
//     All of the row (n = V) is verified whole.
//  3. Kept ids and draw. sampler_kept_ids cuts the sorted ids by top-k, then min-p (drops
//     p < min_p · p_0 from the end) and top-p (the shortest prefix reaching top_p): the
//     kept ids are a prefix. It is settled when top-k ends inside the verified prefix, or
//     min-p's floor is above p_last (everything after the prefix goes), or top-p's cut
//     falls inside it. Sampler::draw then consumes one number of the generator, as
//     Sampler::sample does, only once the kept ids are settled (an undecided step leaves
//     the generator for the CPU path).
//  4. Greedy: the device's first candidate is the largest logit, lowest id on ties —
//     std::max_element's answer; the probabilities use T = 1, as the CPU's do.
// Logit shaping (penalties, bias, held-back tokens) is not applied on the device: the
// session keeps the CPU path for those steps (session.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/backend.h"
#include "engine/sampler.h"

namespace kvscope {

struct DeviceSampleResult {
  std::vector<int32_t> ids;   // the top_candidates best by (p descending, id ascending)
  std::vector<float> p;       // their probabilities after temperature
  std::vector<float> logits;  // their logits
  std::vector<int32_t> kept;  // the ids the draw chooses from (greedy: the argmax)
  std::vector<float> p_kept;  // their probabilities
};

// How many candidates the device returns for this sampler and top_candidates over a
// vocabulary of V: the top list and the top-k cut plus one (the p_last that bounds the
// rest), 65 when only min-p or top-p cut (enough for a peaked distribution). 0 when the
// device path cannot decide anyway: temperature with no cut keeps every id in the draw;
// a top-k or a top list beyond kernels' 256.
int device_sample_candidates_needed(const SamplerConfig& cfg, int top_candidates, int V);

// The top list and the kept ids (see the file comment), or nullopt when the candidates do
// not settle them: a NaN or infinite logit, an undecided inv, a cut past the verified prefix.
std::optional<DeviceSampleResult> device_sample_resolve(const DeviceCandidates& dc, int V,
                                                        const SamplerConfig& cfg,
                                                        int top_candidates);

}  // namespace kvscope
