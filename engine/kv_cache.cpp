// kv_cache.cpp — the KV cache's slot/position bookkeeping (see kv_cache.h).
#include "engine/kv_cache.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "engine/kv_pool.h"

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

KvLayerGroups kv_layer_groups(const KvCacheConfig& c) {
  KvLayerGroups g;
  const int L = int(c.layers.size());
  std::vector<std::array<int, 3>> kinds;  // distinct (window, sink, keep), first seen first
  std::vector<std::vector<int>> members;
  for (int l = 0; l < L; ++l) {
    const KvLayerRule& r = c.layers[size_t(l)];
    const std::array<int, 3> k{r.window, r.sink, r.keep};
    auto it = std::find(kinds.begin(), kinds.end(), k);
    if (it == kinds.end()) {
      kinds.push_back(k);
      members.emplace_back();
      it = kinds.end() - 1;
    }
    members[size_t(it - kinds.begin())].push_back(l);
  }
  for (const auto& m : members) g.size = std::gcd(g.size, int(m.size()));
  g.group_of.assign(size_t(L), 0);
  g.index_of.assign(size_t(L), 0);
  for (size_t k = 0; k < kinds.size(); ++k)
    for (size_t i = 0; i < members[k].size(); ++i) {
      if (i % size_t(g.size) == 0) {
        g.window.push_back(kinds[k][0]);
        g.sink.push_back(kinds[k][1]);
        g.keep.push_back(kinds[k][2]);
      }
      g.group_of[size_t(members[k][i])] = g.count() - 1;
      g.index_of[size_t(members[k][i])] = int(i % size_t(g.size));
    }
  return g;
}

KvCache::KvCache(KvCacheConfig config) : cfg_(std::move(config)) {
  cfg_.layers.resize(size_t(std::max(0, cfg_.shape.n_layer)));
  pos_.resize(cfg_.layers.size());
}

KvCache::KvCache(KvCacheConfig config, std::shared_ptr<KvPool> pool)
    : KvCache(std::move(config)) {
  pool_ = std::move(pool);
  if (pool_) block_ = std::max(1, pool_->block_size());
}

KvCache::~KvCache() { release(); }

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
  if (pool_) {
    const KvPoolConfig& pc = pool_->config();
    groups_ = kv_layer_groups(cfg_);
    if (pc.shape.n_layer != groups_.size || pc.shape.n_head_kv != s.n_head_kv ||
        pc.shape.head_dim != s.head_dim || !(pc.types == cfg_.types))
      return make_error("kv cache: the pool's blocks hold ", pc.shape.n_layer, " layers x ",
                        pc.shape.n_head_kv, " kv heads x ", pc.shape.head_dim, " dims in ",
                        kv_types_name(pc.types), ", the cache's layer groups ", groups_.size,
                        " x ", s.n_head_kv, " x ", s.head_dim, " in ", kv_types_name(cfg_.types));
    tables_.assign(size_t(groups_.count()), {});
  }
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
    if (pool_) continue;  // blocks come from the pool as positions arrive
    int n = std::max(1, slots);
    if (r.keep > 0) n = std::min(n, r.sink + r.keep);
    pos_[size_t(l)].assign(size_t(n), -1);
    KV_TRY(relayout(l, n, std::vector<int32_t>(size_t(n), -1)));
  }
  return Status::Ok();
}

int KvCache::slot_of(int layer, int pos) const {
  if (pool_) return pos;  // paged: slots are positions
  return place(rule(layer), n_slots(layer), pos);
}

void KvCache::slots_by_position(int layer, std::vector<int32_t>& slots) const {
  const auto& p = pos_[size_t(layer)];
  slots.clear();
  for (size_t s = 0; s < p.size(); ++s)
    if (p[s] >= 0) slots.push_back(int32_t(s));
  std::sort(slots.begin(), slots.end(),
            [&](int32_t a, int32_t b) { return p[size_t(a)] < p[size_t(b)]; });
}

int KvCache::held(int layer) const {
  const auto& p = pos_[size_t(layer)];
  return int(std::count_if(p.begin(), p.end(), [](int32_t x) { return x >= 0; }));
}

std::vector<KvRange> KvCache::held_ranges(int layer) const {
  const std::vector<int32_t>& slots = pos_[size_t(layer)];
  std::vector<KvRange> out;
  const auto add = [&out](int32_t x) {
    if (!out.empty() && out.back().end == x) {
      ++out.back().end;
    } else {
      out.push_back({x, x + 1});
    }
  };
  // A cache filled front to back holds its positions in ascending slot order: its runs
  // come straight from the slots. Otherwise (a window's ring, a shift) sort a copy.
  int32_t last = -1;
  bool ascending = true;
  for (int32_t x : slots) {
    if (x < 0) continue;
    if (x <= last) {
      ascending = false;
      break;
    }
    last = x;
  }
  if (ascending) {
    for (int32_t x : slots)
      if (x >= 0) add(x);
    return out;
  }
  std::vector<int32_t> ps;
  ps.reserve(slots.size());
  for (int32_t x : slots)
    if (x >= 0) ps.push_back(x);
  std::sort(ps.begin(), ps.end());
  for (int32_t x : ps) add(x);
  return out;
}

uint64_t KvCache::layer_bytes(int layer) const {
  if (pool_) {
    uint64_t blocks = 0;
    for (int32_t b : tables_[size_t(groups_.group_of[size_t(layer)])]) blocks += b >= 0;
    return blocks * uint64_t(block_) * kv_position_bytes(cfg_.shape, cfg_.types);
  }
  return uint64_t(held(layer)) * kv_position_bytes(cfg_.shape, cfg_.types);
}

uint64_t KvCache::bytes_used() const {
  uint64_t b = 0;
  for (int l = 0; l < cfg_.shape.n_layer; ++l) b += layer_bytes(l);
  return b;
}

uint64_t KvCache::rows_bytes() const {
  uint64_t n = 0;
  for (int l = 0; l < cfg_.shape.n_layer; ++l) n += uint64_t(held(l));
  return n * kv_position_bytes(cfg_.shape, cfg_.types);
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
  if (pool_) {  // rows never move in a paged cache: it only grows
    for (int s = 0; s < n_slots; ++s)
      if (from[size_t(s)] >= 0 && from[size_t(s)] != s)
        return make_error("kv cache: a paged cache cannot move rows (layer ", layer, ")");
    KV_TRY(ensure_blocks(n_slots));
    if (defer_changed_) {  // begin(): one refresh after every layer has grown
      changed_pending_ = true;
      return Status::Ok();
    }
    return refresh_paged();
  }
  return relayout(layer, n_slots, from);
}

Status KvCache::begin(int pos0, int T) {
  if (pending_end_ >= 0) return make_error("kv cache: begin() twice without end()");
  if (T <= 0) return make_error("kv cache: no positions to add (T = ", T, ")");
  if (pos0 != length_)
    return make_error("kv cache: the cache holds positions up to ", length_,
                      " but the next write starts at position ", pos0);
  const int end = pos0 + T;
  // Paged: the layers grow one by one below; the backend's copy of the tables and slot
  // maps is refreshed once afterwards (per layer, a block crossing cost L refreshes of
  // every table and map: L² small uploads on a GPU).
  defer_changed_ = pool_ != nullptr;
  changed_pending_ = false;
  for (int l = 0; l < cfg_.shape.n_layer; ++l) {
    const KvLayerRule& r = rule(l);
    const int n = n_slots(l);
    if (r.keep == 0 || pool_) {  // paged: slots are positions, whatever the rule
      const int grown = pool_ ? kv_blocks_for(end, block_) * block_ : std::max({end, 2 * n, 64});
      if (end > n) {
        Status s = resize(l, grown, [](int) { return true; });
        if (!s.ok()) {  // e.g. no block left in the pool: forget what earlier layers took
          defer_changed_ = false;
          cancel();
          return s;
        }
      }
    } else {
      // Ring positions query pos0 may still read: [lo, pos0), at most keep - 1 of them.
      const int lo = std::max(r.sink, pos0 - (r.keep - 1));
      const int ring_need = std::max(0, pos0 - lo) + std::max(0, end - std::max(pos0, r.sink));
      const int need = std::min(r.sink, end) + ring_need;
      if (need > n) {
        const int target = std::max(need, std::min(std::max(2 * n, 64), r.sink + r.keep));
        Status s = resize(l, target, [&](int p) { return p < r.sink || p >= lo; });
        if (!s.ok()) {
          cancel();
          return s;
        }
      }
    }
    auto& map = pos_[size_t(l)];
    for (int p = pos0; p < end; ++p) map[size_t(slot_of(l, p))] = p;
  }
  defer_changed_ = false;
  pending_end_ = end;
  if (changed_pending_) {
    changed_pending_ = false;
    Status s = refresh_paged(PagedChange::Grown);
    if (!s.ok()) {
      cancel();
      return s;
    }
  }
  if (pool_) {
    Status s = copy_shared(pos0, end);
    if (!s.ok()) {
      cancel();
      return s;
    }
  }
  return Status::Ok();
}

Status KvCache::end() {
  if (pending_end_ < 0) return make_error("kv cache: end() without begin()");
  length_ = pending_end_;
  pending_end_ = -1;
  if (!cfg_.trim) return Status::Ok();
  if (pool_) {
    if (hold_drops_) return Status::Ok();
    auto dropped = drop_outside(/*keeping_only=*/true);
    return dropped.ok() ? Status::Ok() : Status(dropped.error());
  }
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
  if (pool_) return shift_paged(first, n);
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
  // Paged: the blocks begin() took for the forgotten positions go back to the pool.
  if (pool_) {
    drop_blocks_past(length_);
    (void)refresh_paged();  // on the error path already; a failed refresh adds nothing
  }
}

void KvCache::drop_blocks_past(int n) {
  const size_t keep = size_t(kv_blocks_for(n, block_));
  for (auto& t : tables_)
    while (t.size() > keep) {
      if (t.back() >= 0) pool_->unref(t.back());
      t.pop_back();
    }
  for (auto& map : pos_) map.resize(keep * size_t(block_), -1);
}

void KvCache::clear_group_slots(int g, int first, int end) {
  for (int l = 0; l < cfg_.shape.n_layer; ++l) {
    if (groups_.group_of[size_t(l)] != g) continue;
    auto& map = pos_[size_t(l)];
    for (int p = first; p < end && p < int(map.size()); ++p) map[size_t(p)] = -1;
  }
}

int KvCache::held_blocks() const {
  if (!pool_) return 0;
  int n = 0;
  for (const auto& t : tables_)
    for (int32_t b : t) n += b >= 0;
  return n;
}

Status KvCache::refresh_paged(PagedChange change) {
  if (!paged_synced_) change = PagedChange::Any;
  paged_synced_ = false;
  KV_TRY(paged_changed(change));
  paged_synced_ = true;
  return Status::Ok();
}

Status KvCache::ensure_blocks(int n_slots) {
  const size_t want = size_t(kv_blocks_for(n_slots, block_));
  for (auto& t : tables_)
    while (t.size() < want) {
      auto b = pool_->allocate();
      if (!b.ok()) return b.error();
      t.push_back(*b);
    }
  return Status::Ok();
}

Status KvCache::own_block(int g, int i, bool fill_hole) {
  int32_t& entry = tables_[size_t(g)][size_t(i)];
  const int old = entry;
  if (old < 0 && !fill_hole) return Status::Ok();
  // Shared with another table, or published for the prefix cache (whose rows must stay
  // what the hash says): write into a copy.
  if (old >= 0 && pool_->ref_count(old) < 2 && !pool_->published(old)) return Status::Ok();
  auto fresh = pool_->allocate();
  if (!fresh.ok()) return fresh.error();
  if (old >= 0) {
    Status s = pool_->copy_block(*fresh, old);
    if (!s.ok()) {
      pool_->unref(*fresh);
      return s;
    }
    pool_->unref(old);
    ++cow_copies_;
  }
  entry = *fresh;
  return refresh_paged();
}

Status KvCache::copy_shared(int pos0, int end) {
  for (int g = 0; g < int(tables_.size()); ++g)
    for (int i = pos0 / block_; i <= (end - 1) / block_ && i < int(tables_[size_t(g)].size()); ++i)
      KV_TRY(own_block(g, i, /*fill_hole=*/false));
  return Status::Ok();
}

Status KvCache::shift_paged(int first, int n) {
  const int len = length_, kept = len - n;
  // Position p's rows exist in group g when the slot map of the group's layers says so.
  std::vector<int> first_layer(tables_.size(), -1);
  for (int l = cfg_.shape.n_layer - 1; l >= 0; --l)
    first_layer[size_t(groups_.group_of[size_t(l)])] = l;
  // Every later position p moves to p - n: its block there must be this table's alone
  // (copied if shared, taken from the pool if a hole) before any row moves.
  std::vector<KvPool::RowMove> moves;
  for (int g = 0; g < int(tables_.size()); ++g) {
    const auto& map = pos_[size_t(first_layer[size_t(g)])];
    for (int s = first; s < kept; ++s)
      if (map[size_t(s + n)] == s + n) KV_TRY(own_block(g, s / block_, /*fill_hole=*/true));
    for (int s = first; s < kept; ++s) {
      if (map[size_t(s + n)] != s + n) continue;
      const int dst = physical_slot(first_layer[size_t(g)], s);
      const int src = physical_slot(first_layer[size_t(g)], s + n);
      KvPool::RowMove* last = moves.empty() ? nullptr : &moves.back();
      // A move stays inside one block on each side and never overlaps itself (n rows at most).
      if (last && last->dst + last->n == dst && last->src + last->n == src && dst % block_ != 0 &&
          src % block_ != 0 && last->n < n)
        ++last->n;
      else
        moves.push_back({dst, src, 1});
    }
  }
  KV_TRY(pool_->move_rows(moves));
  for (int l = 0; l < cfg_.shape.n_layer; ++l) {
    auto& map = pos_[size_t(l)];
    for (int s = first; s < kept; ++s) map[size_t(s)] = map[size_t(s + n)] == s + n ? s : -1;
    for (int s = kept; s < int(map.size()); ++s) map[size_t(s)] = -1;
  }
  length_ = kept;
  drop_blocks_past(kept);
  if (cfg_.trim) {
    auto dropped = drop_outside(/*keeping_only=*/true);
    if (!dropped.ok()) return dropped.error();
  }
  return refresh_paged();
}

Status KvCache::adopt(const std::vector<int32_t>& blocks, int n) {
  if (pool_ && tables_.size() != 1)
    return make_error("kv cache: this cache has ", tables_.size(),
                      " layer groups; adopt one block table per group");
  return adopt_groups({blocks}, n);
}

Status KvCache::adopt_groups(const std::vector<std::vector<int32_t>>& tables, int n) {
  if (!pool_) return make_error("kv cache: only a paged cache can adopt blocks");
  if (pending_end_ >= 0 || length_ != 0)
    return make_error("kv cache: adopt() on a cache that already holds ", length_, " positions");
  if (tables.size() != tables_.size())
    return make_error("kv cache: ", tables.size(), " block tables for ", tables_.size(),
                      " layer groups");
  for (size_t g = 0; g < tables.size(); ++g) {
    if (n < 0 || int(tables[g].size()) != kv_blocks_for(n, block_))
      return make_error("kv cache: ", tables[g].size(), " blocks of ", block_,
                        " cannot hold exactly ", n, " positions");
    // A hole may stand only for a block a query at n cannot see.
    const int W = groups_.window[g], sink = groups_.sink[g];
    for (size_t i = 0; i < tables[g].size(); ++i) {
      const int32_t b = tables[g][i];
      const bool unseen = W > 0 && int(i + 1) * block_ <= n - W + 1 && int(i) * block_ >= sink;
      if (b < 0 && unseen) continue;
      if (b < 0 || b >= pool_->n_blocks() || pool_->ref_count(b) < 1)
        return make_error("kv cache: block ", b, " is not a block in use");
    }
  }
  release();
  for (const auto& t : tables)
    for (int32_t b : t)
      if (b >= 0) pool_->ref(b);
  tables_ = tables;
  const int slots = kv_blocks_for(n, block_) * block_;
  for (int l = 0; l < cfg_.shape.n_layer; ++l) {
    const auto& t = tables_[size_t(groups_.group_of[size_t(l)])];
    auto& map = pos_[size_t(l)];
    map.assign(size_t(slots), -1);
    for (int p = 0; p < n; ++p)
      if (t[size_t(p / block_)] >= 0) map[size_t(p)] = p;
  }
  length_ = n;
  return refresh_paged();
}

Expected<int> KvCache::drop_outside_windows() { return drop_outside(/*keeping_only=*/false); }

Expected<int> KvCache::drop_outside(bool keeping_only) {
  if (!pool_ || pending_end_ >= 0) return 0;
  int dropped = 0;
  for (size_t g = 0; g < tables_.size(); ++g) {
    const int W = groups_.window[g], sink = groups_.sink[g];
    if (W <= 0 || (keeping_only && groups_.keep[g] == 0)) continue;
    const int lo = length_ - W + 1;  // the oldest key a query at length() sees
    auto& t = tables_[g];
    for (int i = 0; i < int(t.size()) && (i + 1) * block_ <= lo; ++i) {
      if (t[size_t(i)] < 0 || i * block_ < sink) continue;
      pool_->unref(t[size_t(i)]);
      t[size_t(i)] = -1;
      clear_group_slots(int(g), i * block_, (i + 1) * block_);
      ++dropped;
    }
  }
  if (dropped > 0) KV_TRY(refresh_paged());
  return dropped;
}

Status KvCache::hold_window_drops(bool hold) {
  hold_drops_ = hold;
  if (hold || !pool_ || !cfg_.trim) return Status::Ok();
  auto dropped = drop_outside(/*keeping_only=*/true);
  return dropped.ok() ? Status::Ok() : Status(dropped.error());
}

void KvCache::release() {
  if (!pool_) return;
  paged_synced_ = false;  // the backend's copy still shows what is released here
  for (auto& t : tables_) {
    for (int32_t b : t)
      if (b >= 0) pool_->unref(b);
    t.clear();
  }
  for (auto& map : pos_) map.clear();
  length_ = 0;
  pending_end_ = -1;
}

Status KvCache::truncate(int n) {
  if (pending_end_ >= 0) return make_error("kv cache: truncate inside a begin()/end()");
  if (n < 0 || n > length_)
    return make_error("kv cache: truncate to ", n, " positions of ", length_);
  for (int l = 0; l < cfg_.shape.n_layer && !pool_; ++l)
    if (rule(l).keep != 0)
      return make_error("kv cache: layer ", l, " is a ring and cannot be truncated");
  for (size_t g = 0; pool_ && g < tables_.size(); ++g) {
    const int W = groups_.window[g];
    if (W <= 0) continue;
    const int lo = std::max(groups_.sink[g], n - W + 1);
    for (int i = std::max(0, lo) / block_; i < kv_blocks_for(n, block_); ++i)
      if (tables_[g][size_t(i)] < 0)
        return make_error("kv cache: cannot truncate to ", n, " positions: a windowed layer "
                          "already gave back the block of positions ", i * block_, "..",
                          (i + 1) * block_ - 1, " that a query there would see");
  }
  length_ = n;
  for (auto& map : pos_)
    for (int32_t& p : map)
      if (p >= n) p = -1;
  if (pool_) {
    drop_blocks_past(n);
    return refresh_paged();
  }
  return Status::Ok();
}

}  // namespace kvscope
