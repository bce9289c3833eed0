// memory_whatif.h — what the memory what-if panel shows, all from the engine's KV memory
// formula (engine/kv_memory.h: 2 × layers × KV heads × head dim × bytes per value ×
// positions held), never derived again here.
//
// A choice (cache types, the model's own windows on or off, sink + window, GQA or one KV
// head per query head) is evaluated for this model and for the reference shapes at
// a context length the user picks; the same model across the four cache types; and the
// run's own settings at its sequence length, next to the bytes the run really holds, so the
// live number and the formula can be compared. No ImGui: the panel draws these rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv_memory.h"
#include "engine/kv_policy.h"

namespace kvscope::app {

struct WhatIfChoice {
  KvTypes types;
  bool model_window = true;  // the model's own windowed layers keep only their window
  int sink = 0, window = 0;  // sink + window on every layer (window 0: off)
  bool one_kv_head_per_query_head = false;
  int block = 0;  // > 0: the cache holds whole blocks of this many positions (the KV pool)
  bool operator==(const WhatIfChoice&) const = default;
};

struct WhatIfRow {
  std::string name;
  uint64_t per_token = 0;  // bytes one position costs across all layers
  uint64_t at_ctx = 0;     // bytes the cache holds after `ctx` tokens
};

// The formula's options and shape for a choice (the model's windows dropped when off).
KvMemoryOptions whatif_options(const WhatIfChoice& c);
KvMemoryShape whatif_shape(KvMemoryShape s, const WhatIfChoice& c);

// This model (first) and every reference shape (kv_reference_shapes) under `c` at `ctx`.
std::vector<WhatIfRow> whatif_models(const KvMemoryShape& model, const WhatIfChoice& c,
                                     int64_t ctx);
// This model at `ctx` under `c` for each cache type, K and V alike: f32, f16, q8_0, q4_0
// (a type whose blocks do not fit the head dimension gives 0 bytes).
std::vector<WhatIfRow> whatif_types(const KvMemoryShape& model, const WhatIfChoice& c, int64_t ctx);

// A run's own settings as a choice (the model's windows on, as the engine runs it).
WhatIfChoice run_kv_choice(KvTypes types, const KvLimits& limits, int block = 16);

// The run as it stands, next to the formula for its own settings.
struct LiveKv {
  int positions = 0;            // positions that went through the cache
  uint64_t held = 0;            // bytes the run's cache really holds (StepTrace::kv_bytes)
  uint64_t formula = 0;         // the formula for the run's settings at `positions`
  // The same in the whole blocks a paged cache holds (equal to formula when block is 0);
  // what `held` must equal.
  uint64_t in_blocks = 0;
  uint64_t without_window = 0;  // in_blocks with no window at all (every position held)
  uint64_t per_token = 0;       // bytes per position, every layer (GQA as the model has it)
  uint64_t per_token_mha = 0;   // the same with one KV head per query head
};
LiveKv live_kv(const KvMemoryShape& model, const WhatIfChoice& run, int positions, uint64_t held);

}  // namespace kvscope::app
