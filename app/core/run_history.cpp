// run_history.cpp — filing measured step series by prompt and mode.
#include "app/core/run_history.h"

namespace kvscope::app {

namespace {
int mode_index(CacheMode m) { return m == CacheMode::Cache ? 0 : 1; }

void append(RunSeries& s, const StepTrace& t) {
  s.ms.push_back(t.device_ms >= 0 ? t.device_ms : t.ms);
  s.flops.push_back(double(t.flops));
  s.kv_rows.push_back(t.kv_rows);
  s.seq_len.push_back(t.seq_len);
  s.step_mode.push_back(t.mode);
}
}  // namespace

bool RunSeries::mixed() const {
  for (CacheMode m : step_mode)
    if (m != mode) return true;
  return false;
}

void RunHistory::record(const std::string& text, bool chat, uint64_t run, const StepTrace& t) {
  Slot& slot = runs_[Key{text, chat}];
  // A run already filed (under the mode of its first step) keeps growing there.
  for (int i = 0; i < 2; ++i) {
    RunSeries& s = slot.by_mode[i];
    if (slot.has[i] && s.run == run) {
      append(s, t);
      return;
    }
  }
  int i = mode_index(t.mode);
  RunSeries s;
  s.run = run;
  s.mode = t.mode;
  s.prompt_len = t.seq_len - 1 - (t.step - 1);  // SEQ_LEN before the run's first step
  append(s, t);
  slot.by_mode[i] = std::move(s);
  slot.has[i] = true;
}

void RunHistory::finish(const std::string& text, bool chat, uint64_t run) {
  auto it = runs_.find(Key{text, chat});
  if (it == runs_.end()) return;
  for (int i = 0; i < 2; ++i)
    if (it->second.has[i] && it->second.by_mode[i].run == run) it->second.by_mode[i].finished = true;
}

const RunSeries* RunHistory::find(const std::string& text, bool chat, CacheMode mode) const {
  auto it = runs_.find(Key{text, chat});
  if (it == runs_.end()) return nullptr;
  int i = mode_index(mode);
  return it->second.has[i] ? &it->second.by_mode[i] : nullptr;
}

}  // namespace kvscope::app
