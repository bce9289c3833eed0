// synthetic_run.cpp — hand-built traces for scene tests (synthetic_run.h).
#include "synthetic_run.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace kvscope::test {

using namespace kvscope;
using namespace kvscope::app;

Timeline synthetic_run(const SyntheticRun& spec) {
  const int L = spec.n_layer, H = spec.n_head, P = spec.n_prompt;
  std::vector<int> window = spec.window;
  window.resize(size_t(L), 0);
  Timeline tl;
  Event reset{Event::Kind::Reset, 1};
  reset.prompt_text = "synthetic";
  reset.mode = spec.mode;
  tl.apply(reset);
  for (int step = 1; P + step - 1 < spec.n_tokens; ++step) {
    auto t = std::make_shared<StepTrace>();
    t->step = step;
    t->mode = spec.mode;
    t->pos = P + step - 1;
    t->token_id = 100 + step;
    t->text = " w" + std::to_string(t->pos);
    if (step == 1)
      for (int i = 0; i < P; ++i) t->prompt.push_back({i, " p" + std::to_string(i)});
    t->n_layer = L;
    t->n_head = H;
    t->n_attn = t->pos;
    t->attention.assign(size_t(L) * H * size_t(t->n_attn), 0.0f);
    const int q = t->n_attn - 1;  // the query's position
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        float* a = &t->attention[(size_t(l) * H + h) * size_t(t->n_attn)];
        float sum = 0;
        for (int j = 0; j < t->n_attn; ++j) {
          const KvLayerRule rule{window[size_t(l)], spec.sink, 0};
          if (!rule.visible(j, q)) continue;
          a[j] = (j == 0 ? 20.0f : 0.0f) + 1.0f + 5.0f * std::exp(-float(q - j) / 6.0f) +
                 (std::count(spec.spikes.begin(), spec.spikes.end(), j) ? 12.0f : 0.0f);
          sum += a[j];
        }
        for (int j = 0; j < t->n_attn; ++j) a[j] /= sum;
      }
    if (spec.mode == CacheMode::Cache) {
      t->kv_first_pos = step == 1 ? 0 : t->pos - 1;
      t->kv_written = step == 1 ? P : 1;
    } else {
      t->kv_first_pos = 0;
      t->kv_written = t->pos;
    }
    for (int l = 0; l < L; ++l)
      for (int i = 0; i < t->kv_written; ++i) {
        t->k_norm.push_back(1.0f + 0.1f * float((t->kv_first_pos + i + l) % 7));
        t->v_norm.push_back(1.0f + 0.05f * float((t->kv_first_pos + i) % 5));
      }
    const int computed = t->kv_first_pos + t->kv_written;
    t->kv_layers.resize(size_t(L));
    for (int l = 0; l < L; ++l) {
      KvLayerState& ks = t->kv_layers[size_t(l)];
      ks.window = window[size_t(l)];
      if (spec.mode != CacheMode::Cache) continue;
      const int W = window[size_t(l)];
      if (W == 0 || computed <= spec.sink + W) {
        ks.held = {{0, computed}};
      } else {
        if (spec.sink > 0) ks.held.push_back({0, spec.sink});
        ks.held.push_back({computed - W, computed});
      }
    }
    t->seq_len = t->pos + 1;
    t->tokens_processed = step == 1 ? P : 1;
    Event e{Event::Kind::Step, 1};
    e.trace = t;
    tl.apply(e);
  }
  return tl;
}

}  // namespace kvscope::test
