// synthetic_run.h — timelines made of hand-built StepTraces, for scene tests that need a
// cache shape no built-in model has (small windows, several KV heads, a sink).
//
// Every step after the first generates one token; step 1 prefills the prompt. Attention
// rows: a sink at 0, a local decay and a few fixed spikes, normalized, zero outside each
// layer's window. kv_layers: a windowed layer holds its first `sink` positions and the last
// `window` computed ones; a global layer (window 0) holds everything computed.
#pragma once

#include <string>
#include <vector>

#include "app/core/timeline.h"

namespace kvscope::test {

struct SyntheticRun {
  int n_tokens = 40;  // tokens in the sequence after the last step
  int n_prompt = 8;
  int n_layer = 4;
  int n_head = 4;           // H
  std::vector<int> window;  // [L] per layer window (0: global); empty = all global
  int sink = 0;             // positions kept before the window (windowed layers)
  kvscope::CacheMode mode = kvscope::CacheMode::Cache;
  std::vector<int> spikes;  // positions that get extra attention
};

kvscope::app::Timeline synthetic_run(const SyntheticRun& spec);

}  // namespace kvscope::test
