// stats_view.h — the numbers the Stats panel shows, computed in one place so they agree with
// each other and can be tested without a window.
//
// - Positions are 0-based everywhere: step k writes position `write_pos` (its sampled
//   token); its query is the token at write_pos − 1; SEQ_LEN counts positions 0..write_pos.
// - KV_CACHE counts the blocks of the KV pool the cache holds, each a fixed number of
//   positions in every layer of its group, the last partly used; so bytes held = slots x
//   the model's K+V bytes per (layer, position), where slots >= the positions held (the
//   newest token has no K/V yet). When layers hold different positions (sliding-window
//   layers, sink + window), the count is per layer (fullest and emptiest).
// - Speed: time to first token and prefill tokens/s come from step 1 alone; decode rates from
//   the later steps. "engine" = tokens per second of engine time; "delivered" = per second of
//   wall time over the same steps, so delivered <= engine by construction. When playing at a
//   target speed the engine cannot reach, `behind` says so.
#pragma once

#include <cstdint>
#include <string>

#include "app/core/step_source.h"
#include "app/core/timeline.h"

namespace kvscope::app {

struct StatsView {
  bool has_step = false;
  int step = 0, steps = 0;  // viewed step / steps in the run
  bool live = true;         // the viewed step is the newest
  CacheMode mode = CacheMode::Cache;
  int write_pos = 0, query_pos = 0, seq_len = 0;
  uint64_t flops = 0, flops_total = 0, kv_rows = 0, kv_rows_total = 0;
  uint64_t kv_bytes = 0, kv_transient_bytes = 0;
  int kv_positions = 0;      // positions whose K/V the cache holds (the fullest layer)
  int kv_positions_min = 0;  // the same in the layer holding the fewest (windowed layers)
  uint64_t kv_layer_rows = 0;     // (layer, position) pairs held, 0 when not reported
  uint64_t kv_bytes_per_row = 0;  // K+V bytes of one layer at one position (0: not known)
  uint64_t kv_bytes_per_position = 0;  // K+V bytes of one position in every layer
  // (layer, slot) pairs of the blocks held: kv_bytes / kv_bytes_per_row (>= kv_layer_rows);
  // per layer on average, kv_slots.
  uint64_t kv_layer_slots = 0;
  int kv_slots = 0;
  double step_ms = 0;
  bool device_time = false;
  int tokens_processed = 0;
  SpeedStats speed;
  double target_tok_s = 0;  // 0: as fast as possible
  bool behind = false;      // playing, and delivering under 90% of the target
  std::string finish_reason;
  std::string finish_text;  // finished_text(tl): "" while the run goes on
};

// `target_tok_s` is the speed setting (0 = as fast as possible); `playing` the controller's;
// `kv_bytes_per_token` the model's K+V bytes of one position in every layer
// (ModelFacts::kv_bytes_per_token; 0: not known, and the slots are not counted).
StatsView make_stats_view(const Timeline& tl, double target_tok_s, bool playing,
                          uint64_t kv_bytes_per_token = 0);

// The cache mode chosen in the toolbar while the run's newest step ran in the other one (a
// switch takes effect between steps): "NO CACHE from the next step", or "... from the next
// run" once the run has finished. "" when they agree. The Stats panel and the toolbar both
// show it, so they never disagree about the mode.
std::string pending_mode_text(const Timeline& tl, CacheMode chosen);
// How the run ended, in words: "finished (eos)", "finished (max_tokens)"; a comparison's run
// ends after the comparison's steps, not at the token limit: "comparison finished" (or
// "comparison stopped"). "" while the run goes on.
std::string finished_text(const Timeline& tl);

}  // namespace kvscope::app
