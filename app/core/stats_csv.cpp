// stats_csv.cpp — see stats_csv.h.
#include "app/core/stats_csv.h"

#include <cstdio>

namespace kvscope::app {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"') {
      out += "\"\"";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

void write_stats_csv_header(std::ostream& out) {
  out << "step,pos,token_id,text,mode,tokens_processed,seq_len,flops,flops_total,kv_rows,"
         "kv_rows_total,kv_bytes,kv_transient_bytes,ms,device_ms,top_p,sampled_rank,stop\n";
}

void write_stats_csv_row(std::ostream& out, const StepTrace& t) {
  const double top_p = t.sampled_rank >= 0 && size_t(t.sampled_rank) < t.top.size()
                           ? double(t.top[size_t(t.sampled_rank)].p)
                           : -1.0;
  out << t.step << ',' << t.pos << ',' << t.token_id << ',' << quoted(t.text) << ','
      << cache_mode_name(t.mode) << ',' << t.tokens_processed << ',' << t.seq_len << ',' << t.flops
      << ',' << t.flops_total << ',' << t.kv_rows << ',' << t.kv_rows_total << ',' << t.kv_bytes
      << ',' << t.kv_transient_bytes << ',' << fixed(t.ms, 3) << ',' << fixed(t.device_ms, 3) << ','
      << fixed(top_p, 6) << ',' << t.sampled_rank << ',' << stop_reason_name(t.stop) << '\n';
}

}  // namespace kvscope::app
