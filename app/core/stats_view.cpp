// stats_view.cpp — see stats_view.h.
#include "app/core/stats_view.h"

#include <algorithm>

namespace kvscope::app {

StatsView make_stats_view(const Timeline& tl, double target_tok_s, bool playing,
                          uint64_t kv_bytes_per_token) {
  StatsView v;
  v.steps = tl.step_count();
  v.live = tl.live();
  v.mode = tl.mode();
  v.finish_reason = tl.finish_reason() ? to_string(*tl.finish_reason()) : "";
  v.finish_text = finished_text(tl);
  v.speed = tl.speed();
  v.target_tok_s = target_tok_s;
  const StepTrace* t = tl.viewed();
  if (!t) return v;
  v.has_step = true;
  v.step = t->step;
  v.mode = t->mode;
  v.write_pos = t->pos;
  v.query_pos = t->pos - 1;
  v.seq_len = t->seq_len;
  v.flops = t->flops;
  v.flops_total = t->flops_total;
  v.kv_rows = t->kv_rows;
  v.kv_rows_total = t->kv_rows_total;
  v.kv_bytes = t->kv_bytes;
  v.kv_transient_bytes = t->kv_transient_bytes;
  v.kv_positions = t->kv_bytes > 0 ? t->kv_first_pos + t->kv_written : 0;
  v.kv_positions_min = v.kv_positions;
  if (t->kv_bytes > 0 && !t->kv_layers.empty()) {
    // What each layer's cache holds (windowed layers evict their oldest positions).
    uint64_t rows = 0;
    int lo = 0, hi = 0;
    for (size_t l = 0; l < t->kv_layers.size(); ++l) {
      int n = 0;
      for (const KvRange& r : t->kv_layers[l].held) n += r.end - r.begin;
      rows += uint64_t(n);
      lo = l == 0 ? n : std::min(lo, n);
      hi = l == 0 ? n : std::max(hi, n);
    }
    if (rows > 0) {
      v.kv_positions = hi;
      v.kv_positions_min = lo;
      v.kv_layer_rows = rows;
    }
    const uint64_t L = t->kv_layers.size();
    if (kv_bytes_per_token > 0 && kv_bytes_per_token % L == 0) {
      v.kv_bytes_per_position = kv_bytes_per_token;
      v.kv_bytes_per_row = kv_bytes_per_token / L;
      v.kv_layer_slots = t->kv_bytes / v.kv_bytes_per_row;
      v.kv_slots = int(v.kv_layer_slots / L);
    }
  }
  v.device_time = t->device_ms >= 0;
  v.step_ms = v.device_time ? t->device_ms : t->ms;
  v.tokens_processed = t->tokens_processed;
  v.behind = playing && target_tok_s > 0 && v.speed.window >= 3 &&
             v.speed.delivered_tok_s < 0.9 * target_tok_s;
  return v;
}

std::string pending_mode_text(const Timeline& tl, CacheMode chosen) {
  const StepTrace* last = tl.last();
  const CacheMode ran = last ? last->mode : tl.mode();
  if (ran == chosen) return "";
  return std::string(chosen == CacheMode::NoCache ? "NO CACHE" : "KV CACHE") +
         (tl.finished() && last ? " from the next run" : " from the next step");
}

std::string finished_text(const Timeline& tl) {
  const std::optional<FinishReason> r = tl.finish_reason();
  if (!r) return "";
  if (tl.compare_phase() != ComparePhase::None) {
    if (*r == FinishReason::Stopped) return "comparison stopped";
    if (ended_by_itself(*r))
      return tl.compare_phase() == ComparePhase::CacheLeg ? "comparison: KV CACHE run done"
                                                          : "comparison finished";
  }
  return std::string("finished (") + to_string(*r) + ")";
}

}  // namespace kvscope::app
