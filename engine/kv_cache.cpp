// kv_cache.cpp — the KV cache's slot/position bookkeeping (see kv_cache.h).
#include "engine/kv_cache.h"

#include <algorithm>

namespace kvscope {
namespace {

// Slot of `pos` in a layer of n slots under `r`'s placement.
int place(const KvLayerRule& r, int n, int pos) {
  if (pos < r.sink) return pos;
  const int ring = n - r.sink;
  return ring > 0 ? r.sink + (pos - r.sink) % ring : -1;
}

}  // namespace

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::F32:
      return "f32";
    case KvDtype::F16:
      return "f16";
    case KvDtype::Q8_0:
      return "q8_0";
    case KvDtype::Q4_0:
      return "q4_0";
  }
  return "?";
}

const char* kv_dtype_choices() {
  return "f32, f16, q8_0, q4_0";
}

bool kv_dtype_parse(const std::string& name, KvDtype* out) {
  for (KvDtype t : {KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0})
    if (name == kv_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

uint64_t kv_row_bytes(KvDtype t, int D) {
  switch (t) {
    case KvDtype::F32:
      return uint64_t(D) * 4;
    case KvDtype::F16:
      return uint64_t(D) * 2;
    case KvDtype::Q8_0:
      return D % 32 == 0 ? uint64_t(D / 32) * 34 : 0;
    case KvDtype::Q4_0:
      return D % 32 == 0 ? uint64_t(D / 32) * 18 : 0;
  }
  return 0;
}

std::string kv_types_name(KvTypes t) {
  if (t.k == t.v) return kv_dtype_name(t.k);
  return std::string("k=") + kv_dtype_name(t.k) + ",v=" + kv_dtype_name(t.v);
}

uint64_t kv_position_bytes(const KvShape& s, KvTypes t) {
  return uint64_t(s.n_head_kv) * (kv_row_bytes(t.k, s.head_dim) + kv_row_bytes(t.v, s.head_dim));
}

const char* kv_policy_name(KvPolicy p) {
  return p == KvPolicy::Full ? "full" : "window";
}

std::vector<KvMove> kv_moves(const std::vector<int32_t>& from) {
  std::vector<KvMove> moves;
  for (int s = 0; s < int(from.size()); ++s) {
    const int src = from[size_t(s)];
    if (src < 0) continue;
    if (!moves.empty() && moves.back().dst + moves.back().n == s &&
        moves.back().src + moves.back().n == src) {
      ++moves.back().n;
    } else {
      moves.push_back({s, src, 1});
    }
  }
  return moves;
}

KvCacheConfig kv_config_full(KvShape shape, KvTypes types) {
  KvCacheConfig c;
  c.shape = shape;
  c.types = types;
  c.layers.assign(size_t(std::max(0, shape.n_layer)), KvLayerRule{});
  return c;
}

KvCacheConfig kv_config_scratch(KvCacheConfig c) {
  for (KvLayerRule& r : c.layers) r.keep = 0;
  c.trim = false;
  return c;
}

KvCache::KvCache(KvCacheConfig config) : cfg_(std::move(config)) {
  cfg_.layers.resize(size_t(std::max(0, cfg_.shape.n_layer)));
  pos_.resize(cfg_.layers.size());
}

Status KvCache::init_storage(int slots) {
  const KvShape& s = cfg_.shape;
  if (s.n_layer < 1 || s.n_head_kv < 1 || s.head_dim < 1)
    return make_error("kv cache: shape ", s.n_layer, " layers x ", s.n_head_kv, " kv heads x ",
                      s.head_dim, " dims must be positive");
  for (KvDtype t : {cfg_.types.k, cfg_.types.v})
    if (kv_row_bytes(t, s.head_dim) == 0)
      return make_error("kv cache: type ", kv_dtype_name(t),
                        " stores blocks of 32 values along the head dimension, but this model's "
                        "heads have ",
                        s.head_dim, " dims (use f16 or f32)");
  for (int l = 0; l < s.n_layer; ++l) {
    const KvLayerRule& r = rule(l);
    if (r.window < 0 || r.sink < 0 || r.keep < 0)
      return make_error("kv cache: layer ", l, " rule window ", r.window, ", sink ", r.sink,
                        ", keep ", r.keep, " must not be negative");
    // A ring must hold every key its attention window can see.
    if (r.keep > 0 && (r.window == 0 || r.keep < r.window))
      return make_error("kv cache: layer ", l, " keeps the last ", r.keep,
                        " positions but its attention window is ",
                        r.window == 0 ? std::string("unlimited") : std::to_string(r.window),
                        " (keep must be at least the window)");
    int n = std::max(1, slots);
    if (r.keep > 0) n = std::min(n, r.sink + r.keep);
    pos_[size_t(l)].assign(size_t(n), -1);
    KV_TRY(relayout(l, n, std::vector<int32_t>(size_t(n), -1)));
  }
  return Status::Ok();
}

int KvCache::slot_of(int layer, int pos) const {
  return place(rule(layer), n_slots(layer), pos);
}

std::vector<int32_t> KvCache::slots_by_position(int layer) const {
  const auto& p = pos_[size_t(layer)];
  std::vector<int32_t> slots;
  slots.reserve(p.size());
  for (size_t s = 0; s < p.size(); ++s)
    if (p[s] >= 0) slots.push_back(int32_t(s));
  std::sort(slots.begin(), slots.end(),
            [&](int32_t a, int32_t b) { return p[size_t(a)] < p[size_t(b)]; });
  return slots;
}

int KvCache::held(int layer) const {
  const auto& p = pos_[size_t(layer)];
  return int(std::count_if(p.begin(), p.end(), [](int32_t x) { return x >= 0; }));
}

std::vector<KvRange> KvCache::held_ranges(int layer) const {
  std::vector<int32_t> ps;
  for (int32_t x : pos_[size_t(layer)])
    if (x >= 0) ps.push_back(x);
  std::sort(ps.begin(), ps.end());
  std::vector<KvRange> out;
  for (int32_t x : ps) {
    if (!out.empty() && out.back().end == x) {
      ++out.back().end;
    } else {
      out.push_back({x, x + 1});
    }
  }
  return out;
}

uint64_t KvCache::layer_bytes(int layer) const {
  return uint64_t(held(layer)) * kv_position_bytes(cfg_.shape, cfg_.types);
}

uint64_t KvCache::bytes_used() const {
  uint64_t b = 0;
  for (int l = 0; l < cfg_.shape.n_layer; ++l) b += layer_bytes(l);
  return b;
}

uint64_t KvCache::bytes_allocated() const {
  uint64_t slots = 0;
  for (const auto& p : pos_) slots += p.size();
  return slots * kv_position_bytes(cfg_.shape, cfg_.types);
}

template <class Keep>
Status KvCache::resize(int layer, int n_slots, Keep keep) {
  return relocate(layer, n_slots, [&](int p) { return keep(p) ? p : -1; });
}

template <class To>
Status KvCache::relocate(int layer, int n_slots, To to) {
  const KvLayerRule& r = rule(layer);
  const auto& old = pos_[size_t(layer)];
  std::vector<int32_t> fresh(size_t(n_slots), -1), from(size_t(n_slots), -1);
  for (size_t j = 0; j < old.size(); ++j) {
    if (old[j] < 0) continue;
    const int p = to(old[j]);
    if (p < 0) continue;
    const int s = place(r, n_slots, p);
    if (s < 0 || s >= n_slots || fresh[size_t(s)] >= 0)
      return make_error("kv cache: layer ", layer, ": position ", p, " has no free slot among ",
                        n_slots, " (internal layout error)");
    fresh[size_t(s)] = p;
    from[size_t(s)] = int32_t(j);
  }
  pos_[size_t(layer)] = std::move(fresh);
  return relayout(layer, n_slots, from);
}

Status KvCache::begin(int pos0, int T) {
  if (pending_end_ >= 0) return make_error("kv cache: begin() twice without end()");
  if (T <= 0) return make_error("kv cache: no positions to add (T = ", T, ")");
  if (pos0 != length_)
    return make_error("kv cache: the cache holds positions up to ", length_,
                      " but the next write starts at position ", pos0);
  const int end = pos0 + T;
  for (int l = 0; l < cfg_.shape.n_layer; ++l) {
    const KvLayerRule& r = rule(l);
    const int n = n_slots(l);
    if (r.keep == 0) {
      if (end > n) KV_TRY(resize(l, std::max({end, 2 * n, 64}), [](int) { return true; }));
    } else {
      // Ring positions query pos0 may still read: [lo, pos0), at most keep - 1 of them.
      const int lo = std::max(r.sink, pos0 - (r.keep - 1));
      const int ring_need = std::max(0, pos0 - lo) + std::max(0, end - std::max(pos0, r.sink));
      const int need = std::min(r.sink, end) + ring_need;
      if (need > n) {
        const int target = std::max(need, std::min(std::max(2 * n, 64), r.sink + r.keep));
        KV_TRY(resize(l, target, [&](int p) { return p < r.sink || p >= lo; }));
      }
    }
    auto& map = pos_[size_t(l)];
    for (int p = pos0; p < end; ++p) map[size_t(slot_of(l, p))] = p;
  }
  pending_end_ = end;
  return Status::Ok();
}

Status KvCache::end() {
  if (pending_end_ < 0) return make_error("kv cache: end() without begin()");
  length_ = pending_end_;
  pending_end_ = -1;
  if (!cfg_.trim) return Status::Ok();
  for (int l = 0; l < cfg_.shape.n_layer; ++l) {
    const KvLayerRule& r = rule(l);
    if (r.keep == 0 || n_slots(l) <= r.sink + r.keep) continue;
    const int lo = length_ - r.keep;
    KV_TRY(resize(l, r.sink + r.keep, [&](int p) { return p < r.sink || p >= lo; }));
  }
  return Status::Ok();
}

Status KvCache::shift(int first, int n) {
  if (pending_end_ >= 0) return make_error("kv cache: shift inside a begin()/end()");
  if (first < 0 || n <= 0 || first + n > length_)
    return make_error("kv cache: shift of positions [", first, ", ", first + n,
                      ") outside the positions held [0, ", length_, ")");
  for (int l = 0; l < cfg_.shape.n_layer; ++l)
    KV_TRY(relocate(l, n_slots(l), [&](int p) {
      return p < first ? p : p < first + n ? -1 : p - n;
    }));
  length_ -= n;
  return Status::Ok();
}

void KvCache::cancel() {
  pending_end_ = -1;
  for (auto& map : pos_)
    for (int32_t& p : map)
      if (p >= length_) p = -1;
}

}  // namespace kvscope
