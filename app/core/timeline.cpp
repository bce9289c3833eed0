// timeline.cpp — accumulating events into steps, tokens and K/V norms; history views.
#include "app/core/timeline.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvscope::app {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr size_t kSpeedWindow = 16;

// A step without its per-position arrays (kept for every step of the run).
std::shared_ptr<const StepTrace> slim_copy(const StepTrace& t) {
  auto s = std::make_shared<StepTrace>(t);
  // Assigning fresh vectors frees the memory (`= {}` would keep the capacity).
  s->attention = std::vector<float>();
  s->k_norm = std::vector<float>();
  s->v_norm = std::vector<float>();
  s->prompt = std::vector<PromptToken>();
  return s;
}

size_t trace_bytes(const StepTrace& t) {
  size_t b = sizeof(StepTrace) + t.piece.capacity() + t.text.capacity() + t.emitted.capacity() +
             t.backend.capacity();
  b += t.attention.capacity() * 4 + t.k_norm.capacity() * 4 + t.v_norm.capacity() * 4;
  for (const Candidate& c : t.top) b += sizeof(Candidate) + c.text.capacity();
  for (const PromptToken& p : t.prompt) b += sizeof(PromptToken) + p.text.capacity();
  return b;
}

}  // namespace

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

void use_mapped_memory_for_large_blocks() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);  // fixed: also stops glibc raising it on its own
  mallopt(M_TRIM_THRESHOLD, 4 * 1024 * 1024);
#endif
}

uint64_t process_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}

uint64_t process_peak_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return uint64_t(kb) * 1024;
}

bool reset_peak_resident() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

void Timeline::clear() {
  // Swap with empties so the memory really goes (clear() keeps capacity).
  std::vector<std::shared_ptr<const StepTrace>>().swap(steps_);
  std::vector<uint64_t>().swap(offsets_);
  std::vector<float>().swap(range_log_);
  std::vector<TokenInfo>().swap(tokens_);
  shifts_.clear();
  std::string().swap(generated_);
  for (auto& v : k_norm_) std::vector<float>().swap(v);
  for (auto& v : v_norm_) std::vector<float>().swap(v);
  for (auto& v : k_err_) std::vector<float>().swap(v);
  for (auto& v : v_err_) std::vector<float>().swap(v);
  std::fill(k_min_.begin(), k_min_.end(), std::numeric_limits<float>::infinity());
  std::fill(v_min_.begin(), v_min_.end(), std::numeric_limits<float>::infinity());
  std::fill(k_max_.begin(), k_max_.end(), 0.0f);
  std::fill(v_max_.begin(), v_max_.end(), 0.0f);
  viewed_ = 0;
  viewed_full_.reset();
  viewed_note_.clear();
  arrivals_.clear();
  first_ = SpeedStats{};
  finish_reason_.reset();
  store_.reset();
  compare_ = ComparePhase::None;
}

void Timeline::ensure_layers(int n) {
  if (n <= n_layer_) return;
  n_layer_ = n;
  k_norm_.resize(size_t(n));
  v_norm_.resize(size_t(n));
  k_err_.resize(size_t(n));
  v_err_.resize(size_t(n));
  k_min_.resize(size_t(n), std::numeric_limits<float>::infinity());
  v_min_.resize(size_t(n), std::numeric_limits<float>::infinity());
  k_max_.resize(size_t(n), 0.0f);
  v_max_.resize(size_t(n), 0.0f);
}

int Timeline::index_after(int pos, size_t n_shifts) const {
  if (pos < 0) return -1;
  // Undo the shifts newest first: a position at or after a shift's first moved down by n.
  for (size_t i = std::min(n_shifts, shifts_.size()); i-- > 0;)
    if (pos >= shifts_[i].first) pos += shifts_[i].n;
  return pos;
}

size_t Timeline::shifts_until(int step) const {
  size_t n = 0;
  while (n < shifts_.size() && shifts_[n].step <= step) ++n;
  return n;
}

int Timeline::token_index(int pos) const {
  return token_index_at(pos, viewed_step());
}

int Timeline::token_index_at(int pos, int step) const {
  const int idx = index_after(pos, shifts_until(step));
  return idx >= 0 && idx < int(tokens_.size()) ? idx : -1;
}

int Timeline::position_of_index(int index) const {
  const int step = viewed_step();
  for (size_t i = 0; i < shifts_until(step); ++i) {
    const Shift& s = shifts_[i];
    if (index >= s.first + s.n)
      index -= s.n;
    else if (index >= s.first)
      return -1;
  }
  return index >= 0 && index < viewed_seq_len() ? index : -1;
}

float Timeline::kv_norm_of_index(int index, int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_ || index < 0) return kNaN;
  const auto& row = v ? v_norm_[size_t(layer)] : k_norm_[size_t(layer)];
  return size_t(index) < row.size() ? row[size_t(index)] : kNaN;
}

const TokenInfo* Timeline::token_at(int pos) const {
  const int idx = token_index(pos);
  return idx >= 0 ? &tokens_[size_t(idx)] : nullptr;
}

void Timeline::merge_norms(const StepTrace& t) {
  ensure_layers(t.n_layer);
  if (t.kv_written <= 0 || t.n_layer <= 0 ||
      t.k_norm.size() < size_t(t.n_layer) * size_t(t.kv_written))
    return;
  for (int l = 0; l < t.n_layer; ++l) {
    auto& kn = k_norm_[size_t(l)];
    auto& vn = v_norm_[size_t(l)];
    // Kept in arrival order, like the tokens (the shifts up to this step undone).
    const int first = index_after(t.kv_first_pos, shifts_.size());
    size_t need = size_t(first + t.kv_written);
    if (kn.size() < need) kn.resize(need, kNaN);
    if (vn.size() < need) vn.resize(need, kNaN);
    for (int i = 0; i < t.kv_written; ++i) {
      size_t src = size_t(l) * size_t(t.kv_written) + size_t(i);
      float k = t.k_norm[src];
      float v = src < t.v_norm.size() ? t.v_norm[src] : k;
      const size_t at = size_t(index_after(t.kv_first_pos + i, shifts_.size()));
      kn[at] = k;
      vn[at] = v;
      k_min_[size_t(l)] = std::min(k_min_[size_t(l)], k);
      k_max_[size_t(l)] = std::max(k_max_[size_t(l)], k);
      v_min_[size_t(l)] = std::min(v_min_[size_t(l)], v);
      v_max_[size_t(l)] = std::max(v_max_[size_t(l)], v);
    }
    // The measured quantization errors, where the step has them.
    const size_t n = size_t(l + 1) * size_t(t.kv_written);
    if (t.k_err.size() < n || t.v_err.size() < n) continue;
    for (auto* e : {&k_err_[size_t(l)], &v_err_[size_t(l)]})
      if (e->size() < need) e->resize(need, kNaN);
    for (int i = 0; i < t.kv_written; ++i) {
      const size_t src = size_t(l) * size_t(t.kv_written) + size_t(i);
      const size_t at = size_t(index_after(t.kv_first_pos + i, shifts_.size()));
      k_err_[size_t(l)][at] = t.k_err[src];
      v_err_[size_t(l)][at] = t.v_err[src];
    }
  }
}

bool Timeline::apply(const Event& e) {
  if (e.kind == Event::Kind::Source) {  // another model or recording: nothing carries over
    clear();
    history_.clear();
    n_layer_ = 0;
    k_norm_.clear();
    v_norm_.clear();
    k_err_.clear();
    v_err_.clear();
    k_min_.clear();
    k_max_.clear();
    v_min_.clear();
    v_max_.clear();
    finished_ = true;
    mode_ = e.mode;
    release_free_memory();
    return true;
  }
  if (e.kind == Event::Kind::Reset) {
    clear();
    release_free_memory();
    run_ = e.run;
    prompt_text_ = e.prompt_text;
    prompt_chat_ = e.prompt_chat;
    mode_ = e.mode;
    finished_ = false;
    store_ = e.store;
    compare_ = e.compare;
    return true;
  }
  if (e.run != run_) return false;
  if (e.kind == Event::Kind::ModeChanged) mode_ = e.mode;
  if (e.kind == Event::Kind::Finished) {
    finished_ = true;
    finish_reason_ = e.reason;
    history_.finish(prompt_text_, prompt_chat_, run_);
    if (compare_ == ComparePhase::Interleaved)
      history_.finish(prompt_text_, prompt_chat_, interleaved_run(run_));
  }
  if (e.kind == Event::Kind::CompareStep && e.trace) {  // the other run of this comparison
    history_.record(prompt_text_, prompt_chat_, interleaved_run(run_), *e.trace);
    return true;
  }
  if (e.kind != Event::Kind::Step || !e.trace) return true;
  const StepTrace& t = *e.trace;
  mode_ = t.mode;
  if (t.shift_n > 0) shifts_.push_back({t.step, t.shift_first, t.shift_n});
  for (size_t i = 0; i < t.prompt.size(); ++i) {
    if (tokens_.size() <= i) tokens_.resize(i + 1);
    tokens_[i] = TokenInfo{t.prompt[i].id, t.prompt[i].text, true, 0};
  }
  if (const int at = index_after(t.pos, shifts_.size()); at >= 0) {
    if (tokens_.size() <= size_t(at)) tokens_.resize(size_t(at) + 1);
    tokens_[size_t(at)] = TokenInfo{t.token_id, t.text, t.is_prompt, t.step};
  }
  generated_ += t.emitted;
  merge_norms(t);
  for (const auto* r : {&k_min_, &k_max_, &v_min_, &v_max_})
    range_log_.insert(range_log_.end(), r->begin(), r->end());
  // The previous newest step becomes slim (a viewed older step is held in viewed_full_).
  if (!steps_.empty()) steps_.back() = slim_copy(*steps_.back());
  steps_.push_back(e.trace);
  offsets_.push_back(e.offset);
  history_.record(prompt_text_, prompt_chat_, run_, t);
  if (t.step == 1) {
    first_.ttft_ms = t.device_ms >= 0 ? t.device_ms : t.ms;
    first_.prefill_tokens = t.tokens_processed;
    first_.prefill_tok_s = first_.ttft_ms > 0 ? 1000.0 * t.tokens_processed / first_.ttft_ms : 0;
  } else {
    if (t.mode != first_.mode || first_.mode_since == 0) {
      // A switch of mode: the window starts again; the old mode's rate is kept to show.
      if (first_.mode_since != 0 && t.mode != first_.mode)
        first_.other_engine_tok_s = speed().engine_tok_s;
      arrivals_.clear();
      first_.mode = t.mode;
      first_.mode_since = t.step;
    }
    arrivals_.push_back({e.done_s, t.device_ms >= 0 ? t.device_ms : t.ms});
    while (arrivals_.size() > kSpeedWindow) arrivals_.pop_front();
  }
  return true;
}

void Timeline::scrub_to(int step) {
  const int n = step_count();
  if (n == 0) return;
  step = std::clamp(step, 1, n);
  if ((step == n && viewed_ == 0) || step == viewed_) return;
  viewed_full_.reset();
  viewed_note_.clear();
  if (step == n) {
    viewed_ = 0;
    return;
  }
  viewed_ = step;
  const uint64_t off = offsets_[size_t(step - 1)];
  if (!store_ || off == kNoOffset) {
    viewed_note_ = "this step's attention was not kept (the run has no history spool)";
    return;
  }
  auto t = store_->read_step(off);
  if (!t.ok()) {
    viewed_note_ = t.error().message;
    return;
  }
  if (t->step != step) {
    viewed_note_ = "the history spool holds step " + std::to_string(t->step) + " where step " +
                   std::to_string(step) + " was expected";
    return;
  }
  if (t->attention.empty())
    viewed_note_ = "this step was kept without its attention rows (history disk cap reached)";
  viewed_full_ = std::make_shared<const StepTrace>(std::move(t.value()));
}

const StepTrace* Timeline::viewed() const {
  if (steps_.empty()) return nullptr;
  if (viewed_ == 0) return steps_.back().get();
  if (viewed_full_) return viewed_full_.get();
  return steps_[size_t(viewed_ - 1)].get();
}

int Timeline::viewed_seq_len() const {
  const StepTrace* v = viewed();
  return v ? std::min(v->seq_len, int(tokens_.size())) : int(tokens_.size());
}

const RunSeries* Timeline::current_series() const {
  for (CacheMode m : {CacheMode::Cache, CacheMode::NoCache})
    if (const RunSeries* s = history_.find(prompt_text_, prompt_chat_, m); s && s->run == run_)
      return s;
  return nullptr;
}

const RunSeries* Timeline::other_series() const {
  const RunSeries* cur = current_series();
  CacheMode mine = cur ? cur->mode : mode_;
  CacheMode other = mine == CacheMode::Cache ? CacheMode::NoCache : CacheMode::Cache;
  const RunSeries* s = history_.find(prompt_text_, prompt_chat_, other);
  return s && s->run != run_ ? s : nullptr;
}

float Timeline::kv_norm(int pos, int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_ || pos < 0) return kNaN;
  if (const StepTrace* s = viewed(); s && pos >= s->kv_first_pos + s->kv_written) return kNaN;
  const auto& row = v ? v_norm_[size_t(layer)] : k_norm_[size_t(layer)];
  const int at = index_after(pos, shifts_until(viewed_step()));
  return at >= 0 && size_t(at) < row.size() ? row[size_t(at)] : kNaN;
}
float Timeline::kv_error(int pos, int layer, bool v) const {
  if (const StepTrace* s = viewed(); s && pos >= s->kv_first_pos + s->kv_written) return kNaN;
  return kv_error_of_index(token_index(pos), layer, v);
}

float Timeline::kv_error_of_index(int index, int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_ || index < 0) return kNaN;
  const auto& row = v ? v_err_[size_t(layer)] : k_err_[size_t(layer)];
  return size_t(index) < row.size() ? row[size_t(index)] : kNaN;
}

float Timeline::kv_norm_min(int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_) return 0;
  if (viewed_ != 0 && range_log_.size() >= size_t(viewed_) * 4 * size_t(n_layer_))
    return range_log_[(size_t(viewed_ - 1) * 4 + (v ? 2 : 0)) * size_t(n_layer_) + size_t(layer)];
  return v ? v_min_[size_t(layer)] : k_min_[size_t(layer)];
}
float Timeline::kv_norm_max(int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_) return 0;
  if (viewed_ != 0 && range_log_.size() >= size_t(viewed_) * 4 * size_t(n_layer_))
    return range_log_[(size_t(viewed_ - 1) * 4 + (v ? 3 : 1)) * size_t(n_layer_) + size_t(layer)];
  return v ? v_max_[size_t(layer)] : k_max_[size_t(layer)];
}

SpeedStats Timeline::speed() const {
  SpeedStats s = first_;
  const size_t n = arrivals_.size();
  if (n == 0) return s;
  double engine_ms = 0;
  for (size_t i = (n > 1 ? 1 : 0); i < n; ++i) engine_ms += arrivals_[i].ms;
  if (n == 1) {
    s.engine_tok_s = engine_ms > 0 ? 1000.0 / engine_ms : 0;
    s.window = 1;
    return s;
  }
  // Over the same steps (2nd..last of the window): each gap between two completions holds
  // that step's whole computation, so delivered <= engine by construction.
  s.window = int(n - 1);
  s.engine_tok_s = engine_ms > 0 ? 1000.0 * double(n - 1) / engine_ms : 0;
  const double span = arrivals_.back().done_s - arrivals_.front().done_s;
  s.delivered_tok_s = span > 0 ? double(n - 1) / span : s.engine_tok_s;
  return s;
}

size_t Timeline::memory_bytes() const {
  size_t b = sizeof(*this) + steps_.capacity() * sizeof(steps_[0]) + offsets_.capacity() * 8;
  for (const auto& s : steps_) b += trace_bytes(*s) + 32;  // + shared_ptr control block
  if (viewed_full_) b += trace_bytes(*viewed_full_);
  b += tokens_.capacity() * sizeof(TokenInfo);
  for (const TokenInfo& t : tokens_) b += t.text.capacity();
  for (const auto& r : k_norm_) b += r.capacity() * 4;
  for (const auto& r : v_norm_) b += r.capacity() * 4;
  for (const auto& r : k_err_) b += r.capacity() * 4;
  for (const auto& r : v_err_) b += r.capacity() * 4;
  b += generated_.capacity() + range_log_.capacity() * 4;
  return b;
}

}  // namespace kvscope::app
