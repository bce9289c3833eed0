// stats_csv.h — a run's per-step numbers as CSV (one header row, one row per step).
//
// Columns: step, pos, token_id, text, mode, tokens_processed, seq_len, flops, flops_total,
// kv_rows, kv_rows_total, kv_bytes, kv_transient_bytes, ms, device_ms, top_p, sampled_rank,
// stop. `text` is quoted (quotes doubled; control characters as \n, \t, \r and \xNN escapes,
// so a row is one line); `ms` and `device_ms` have microsecond precision; -1 = not measured.
// The same rows come from a live run, from its recording and from its replay.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "engine/session.h"

namespace kvscope::app {

void write_stats_csv_header(std::ostream& out);
void write_stats_csv_row(std::ostream& out, const StepTrace& t);

}  // namespace kvscope::app
