// kv_pool.cpp — the block pool's bookkeeping (see kv_pool.h).
#include "engine/kv_pool.h"

#include <algorithm>

namespace kvscope {
namespace {

// FNV-1a over 64-bit words, then a final mix: cheap, deterministic across runs and
// machines (the prefix cache's keys are compared, never stored).
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t w) {
    for (int i = 0; i < 8; ++i) {
      h ^= (w >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  uint64_t done() const {
    uint64_t x = h;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x | 1;  // never 0: 0 is "no parent"
  }
};

}  // namespace

const char* kv_block_size_choices() { return "8, 16, 32"; }

bool kv_block_size_ok(int b) { return b == 8 || b == 16 || b == 32; }

Status kv_pool_config_check(const KvPoolConfig& c) {
  if (c.n_blocks < 1 || !kv_block_size_ok(c.block_size))
    return make_error("kv pool: ", c.n_blocks, " blocks of ", c.block_size,
                      " positions (at least one block; block size one of ",
                      kv_block_size_choices(), ")");
  return Status::Ok();
}

uint64_t kv_block_bytes(const KvPoolConfig& c) {
  return uint64_t(c.block_size) * uint64_t(std::max(0, c.shape.n_layer)) *
         kv_position_bytes(c.shape, c.types);
}

int kv_pool_blocks_for_mib(const KvPoolConfig& c, uint64_t mib) {
  const uint64_t b = kv_block_bytes(c);
  if (b == 0) return 0;
  return int(std::min<uint64_t>((mib << 20) / b, 1u << 30));
}

KvPool::KvPool(KvPoolConfig cfg)
    : cfg_(std::move(cfg)),
      ref_(size_t(std::max(0, cfg_.n_blocks)), 0),
      on_free_(ref_.size(), 1),
      lru_at_(ref_.size(), lru_.end()),
      has_hash_(ref_.size(), 0),
      hash_(ref_.size(), 0) {
  for (int b = cfg_.n_blocks - 1; b >= 0; --b) free_.push_back(b);
  Hasher h;
  for (int v : {cfg_.shape.n_layer, cfg_.shape.n_head_kv, cfg_.shape.head_dim,
                int(cfg_.types.k), int(cfg_.types.v), cfg_.block_size})
    h.add(uint64_t(uint32_t(v)));
  cfg_hash_ = h.done();
}

Expected<int> KvPool::allocate() {
  int b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
    on_free_[size_t(b)] = 0;
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    lru_at_[size_t(b)] = lru_.end();
    by_hash_.erase(hash_[size_t(b)]);
    has_hash_[size_t(b)] = 0;
  } else {
    return make_error("kv pool: all ", cfg_.n_blocks, " blocks of ", cfg_.block_size,
                      " positions are in use");
  }
  ref_[size_t(b)] = 1;
  return b;
}

void KvPool::ref(int b) {
  if (ref_[size_t(b)]++ == 0 && lru_at_[size_t(b)] != lru_.end()) {
    lru_.erase(lru_at_[size_t(b)]);
    lru_at_[size_t(b)] = lru_.end();
  }
}

void KvPool::unref(int b) {
  if (--ref_[size_t(b)] > 0) return;
  if (has_hash_[size_t(b)]) {
    lru_at_[size_t(b)] = lru_.insert(lru_.end(), b);
  } else {
    // Keep the stack ordered so that the lowest free id is handed out first: runs are
    // reproducible and tiles fill the scene's grid from the start.
    auto at = std::lower_bound(free_.begin(), free_.end(), b, std::greater<int32_t>());
    free_.insert(at, b);
    on_free_[size_t(b)] = 1;
  }
}

KvPoolCounts KvPool::counts() const {
  KvPoolCounts c;
  c.total = cfg_.n_blocks;
  c.free = int(free_.size());
  c.cached = int(lru_.size());
  c.used = c.total - c.free - c.cached;
  return c;
}

uint64_t KvPool::chain_hash(uint64_t parent, const int32_t* ids, int n, uint64_t salt) const {
  Hasher h;
  h.add(cfg_hash_);
  h.add(salt);
  h.add(parent);
  h.add(uint64_t(n));
  for (int i = 0; i < n; ++i) h.add(uint64_t(uint32_t(ids[i])));
  return h.done();
}

int KvPool::lookup(uint64_t hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  ref(it->second);
  return it->second;
}

void KvPool::publish(int b, uint64_t hash) {
  if (has_hash_[size_t(b)] || by_hash_.count(hash)) return;
  has_hash_[size_t(b)] = 1;
  hash_[size_t(b)] = hash;
  by_hash_.emplace(hash, b);
}

Status KvPool::copy_block(int dst, int src) {
  if (dst < 0 || dst >= cfg_.n_blocks || src < 0 || src >= cfg_.n_blocks || dst == src)
    return make_error("kv pool: copy of block ", src, " to block ", dst, " of ", cfg_.n_blocks);
  return do_copy_block(dst, src);
}

Status KvPool::move_rows(const std::vector<RowMove>& moves) {
  const int B = cfg_.block_size, slots = cfg_.n_blocks * B;
  for (const RowMove& m : moves) {
    const bool inside = m.n > 0 && m.dst >= 0 && m.src >= 0 && m.dst + m.n <= slots &&
                        m.src + m.n <= slots && m.dst / B == (m.dst + m.n - 1) / B &&
                        m.src / B == (m.src + m.n - 1) / B &&
                        (m.dst + m.n <= m.src || m.src + m.n <= m.dst);
    if (!inside)
      return make_error("kv pool: a move of ", m.n, " rows from slot ", m.src, " to slot ", m.dst,
                        " does not lie within blocks of the pool's ", slots, " slots");
  }
  return moves.empty() ? Status::Ok() : do_move_rows(moves);
}

Status KvPool::check(const std::vector<const std::vector<int32_t>*>& tables) const {
  std::vector<int> seen(ref_.size(), 0);
  for (const auto* t : tables)
    for (int32_t b : *t) {
      if (b == -1) continue;  // a hole: a windowed group gave the block back
      if (b < 0 || b >= cfg_.n_blocks)
        return make_error("kv pool: a block table points to block ", b, " of ", cfg_.n_blocks);
      ++seen[size_t(b)];
    }
  size_t n_published = 0;
  for (int b = 0; b < cfg_.n_blocks; ++b) {
    const size_t i = size_t(b);
    if (seen[i] != ref_[i])
      return make_error("kv pool: block ", b, " has count ", ref_[i], " but ", seen[i],
                        " table entries point to it");
    const bool in_lru = lru_at_[i] != lru_.end();
    const int states = int(ref_[i] > 0) + int(on_free_[i] != 0) + int(in_lru);
    if (states != 1)
      return make_error("kv pool: block ", b, " (count ", ref_[i], ", on the free list ",
                        on_free_[i] != 0, ", cached ", in_lru, ") is not in exactly one state");
    if (in_lru && !has_hash_[i])
      return make_error("kv pool: block ", b, " is cached but not published");
    if (on_free_[i] && has_hash_[i])
      return make_error("kv pool: block ", b, " is free but still published");
    if (has_hash_[i]) {
      ++n_published;
      auto it = by_hash_.find(hash_[i]);
      if (it == by_hash_.end() || it->second != b)
        return make_error("kv pool: block ", b, " is published but its hash names another block");
    }
  }
  if (n_published != by_hash_.size())
    return make_error("kv pool: ", by_hash_.size(), " hashes for ", n_published,
                      " published blocks");
  size_t n_free = 0;
  for (char f : on_free_) n_free += f != 0;
  if (n_free != free_.size()) return make_error("kv pool: the free list holds a block twice");
  const KvPoolCounts c = counts();
  if (c.used < 0 || c.used + c.free + c.cached != c.total)
    return make_error("kv pool: used ", c.used, " + free ", c.free, " + cached ", c.cached,
                      " != total ", c.total);
  return Status::Ok();
}

}  // namespace kvscope
