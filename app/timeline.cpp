// timeline.cpp — accumulating traces into per-position token and K/V data.
#include "app/timeline.h"

#include <algorithm>
#include <limits>

namespace kvscope::app {

void Timeline::clear() {
  steps_.clear();
  tokens_.clear();
  generated_.clear();
  for (auto& v : k_norm_) v.clear();
  for (auto& v : v_norm_) v.clear();
  std::fill(k_min_.begin(), k_min_.end(), std::numeric_limits<float>::infinity());
  std::fill(v_min_.begin(), v_min_.end(), std::numeric_limits<float>::infinity());
  std::fill(k_max_.begin(), k_max_.end(), 0.0f);
  std::fill(v_max_.begin(), v_max_.end(), 0.0f);
}

void Timeline::ensure_layers(int n) {
  if (n <= n_layer_) return;
  n_layer_ = n;
  k_norm_.resize(size_t(n));
  v_norm_.resize(size_t(n));
  k_min_.resize(size_t(n), std::numeric_limits<float>::infinity());
  v_min_.resize(size_t(n), std::numeric_limits<float>::infinity());
  k_max_.resize(size_t(n), 0.0f);
  v_max_.resize(size_t(n), 0.0f);
}

bool Timeline::apply(const Event& e) {
  if (e.kind == Event::Kind::Reset) {
    clear();
    run_ = e.run;
    prompt_text_ = e.prompt_text;
    prompt_chat_ = e.prompt_chat;
    mode_ = e.mode;
    finished_ = false;
    return true;
  }
  if (e.run != run_) return false;
  if (e.kind == Event::Kind::ModeChanged) mode_ = e.mode;
  if (e.kind == Event::Kind::Finished || e.kind == Event::Kind::Error) {
    finished_ = true;
    history_.finish(prompt_text_, prompt_chat_, run_);
  }
  if (e.kind != Event::Kind::Step || !e.trace) return true;
  const StepTrace& t = *e.trace;
  mode_ = t.mode;
  for (size_t i = 0; i < t.prompt.size(); ++i) {
    if (tokens_.size() <= i) tokens_.resize(i + 1);
    tokens_[i] = TokenInfo{t.prompt[i].id, t.prompt[i].text, true, 0};
  }
  if (t.pos >= 0) {
    if (tokens_.size() <= size_t(t.pos)) tokens_.resize(size_t(t.pos) + 1);
    tokens_[size_t(t.pos)] = TokenInfo{t.token_id, t.text, t.is_prompt, t.step};
  }
  generated_ += t.emitted;
  ensure_layers(t.n_layer);
  if (t.kv_written > 0 && t.n_layer > 0 &&
      t.k_norm.size() >= size_t(t.n_layer) * size_t(t.kv_written)) {
    for (int l = 0; l < t.n_layer; ++l) {
      auto& kn = k_norm_[size_t(l)];
      auto& vn = v_norm_[size_t(l)];
      size_t need = size_t(t.kv_first_pos + t.kv_written);
      if (kn.size() < need) kn.resize(need, std::numeric_limits<float>::quiet_NaN());
      if (vn.size() < need) vn.resize(need, std::numeric_limits<float>::quiet_NaN());
      for (int i = 0; i < t.kv_written; ++i) {
        size_t src = size_t(l) * size_t(t.kv_written) + size_t(i);
        float k = t.k_norm[src];
        float v = src < t.v_norm.size() ? t.v_norm[src] : k;
        kn[size_t(t.kv_first_pos + i)] = k;
        vn[size_t(t.kv_first_pos + i)] = v;
        k_min_[size_t(l)] = std::min(k_min_[size_t(l)], k);
        k_max_[size_t(l)] = std::max(k_max_[size_t(l)], k);
        v_min_[size_t(l)] = std::min(v_min_[size_t(l)], v);
        v_max_[size_t(l)] = std::max(v_max_[size_t(l)], v);
      }
    }
  }
  steps_.push_back(e.trace);
  history_.record(prompt_text_, prompt_chat_, run_, t);
  return true;
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
  if (layer < 0 || layer >= n_layer_ || pos < 0) return std::numeric_limits<float>::quiet_NaN();
  const auto& row = v ? v_norm_[size_t(layer)] : k_norm_[size_t(layer)];
  return size_t(pos) < row.size() ? row[size_t(pos)] : std::numeric_limits<float>::quiet_NaN();
}
float Timeline::kv_norm_min(int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_) return 0;
  return v ? v_min_[size_t(layer)] : k_min_[size_t(layer)];
}
float Timeline::kv_norm_max(int layer, bool v) const {
  if (layer < 0 || layer >= n_layer_) return 0;
  return v ? v_max_[size_t(layer)] : k_max_[size_t(layer)];
}

}  // namespace kvscope::app
