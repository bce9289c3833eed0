// memory_whatif.cpp — the what-if panel's numbers from the engine's formula (memory_whatif.h).
#include "app/core/memory_whatif.h"

namespace kvscope::app {

KvMemoryOptions whatif_options(const WhatIfChoice& c) {
  KvMemoryOptions o;
  o.types = c.types;
  o.window = c.window;
  o.sink = c.window > 0 ? c.sink : 0;
  o.one_kv_head_per_query_head = c.one_kv_head_per_query_head;
  o.block = c.block;
  return o;
}

KvMemoryShape whatif_shape(KvMemoryShape s, const WhatIfChoice& c) {
  if (!c.model_window) s.layer_window.clear();
  return s;
}

namespace {
WhatIfRow row(const KvMemoryShape& s, const WhatIfChoice& c, int64_t ctx, std::string name) {
  const KvMemoryShape shape = whatif_shape(s, c);
  const KvMemoryOptions o = whatif_options(c);
  return {std::move(name), kv_bytes_per_token(shape, o), kv_bytes(shape, o, ctx)};
}
}  // namespace

std::vector<WhatIfRow> whatif_models(const KvMemoryShape& model, const WhatIfChoice& c,
                                     int64_t ctx) {
  std::vector<WhatIfRow> rows{row(model, c, ctx, model.name)};
  for (const KvMemoryShape& ref : kv_reference_shapes()) rows.push_back(row(ref, c, ctx, ref.name));
  return rows;
}

std::vector<WhatIfRow> whatif_types(const KvMemoryShape& model, const WhatIfChoice& c,
                                    int64_t ctx) {
  std::vector<WhatIfRow> rows;
  for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0}) {
    WhatIfChoice ct = c;
    ct.types = {t, t};
    rows.push_back(row(model, ct, ctx, kv_dtype_name(t)));
  }
  return rows;
}

WhatIfChoice run_kv_choice(KvTypes types, const KvLimits& limits, int block) {
  WhatIfChoice c;
  c.types = types;
  c.block = block;
  c.window = limits.window;
  c.sink = limits.window > 0 ? limits.sink : 0;
  return c;
}

LiveKv live_kv(const KvMemoryShape& model, const WhatIfChoice& run, int positions, uint64_t held) {
  LiveKv l;
  const int seq_len = positions;
  l.positions = positions;
  l.held = held;
  const KvMemoryOptions o = whatif_options(run);
  l.in_blocks = kv_bytes(whatif_shape(model, run), o, seq_len);
  KvMemoryOptions exact = o;
  exact.block = 0;
  l.formula = kv_bytes(whatif_shape(model, run), exact, seq_len);
  WhatIfChoice all = run;
  all.model_window = false;
  all.window = all.sink = 0;
  l.without_window = kv_bytes(whatif_shape(model, all), whatif_options(all), seq_len);
  l.per_token = kv_bytes_per_token(model, o);
  WhatIfChoice mha = run;
  mha.one_kv_head_per_query_head = true;
  l.per_token_mha = kv_bytes_per_token(model, whatif_options(mha));
  return l;
}

}  // namespace kvscope::app
