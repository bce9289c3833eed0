// kv_pool.h — one pool of fixed-size KV blocks that many sequences' caches share.
//
// A block holds block_size consecutive positions of one sequence in one group of layers
// (config.shape.n_layer of them; kv_layer_groups in engine/kv_cache.h): for a model
// without attention windows, every layer, so block b is the same block id in each
// layer's K and V store. The backend owns the storage
// (KvPool is subclassed by each backend; the CPU's lays each layer's K and V out as
// [Hkv][n_blocks * block_size][row bytes], so physical slot b * block_size + i is row i of
// block b). This class keeps the bookkeeping, the same for every backend:
//   - a reference count per block: the number of block tables that point to it;
//   - a free list of blocks nobody references and nobody may reuse by hash;
//   - the prefix cache: a full block may be published under a hash chained from its
//     parent block's hash, its token ids and the cache configuration (chain_hash). A new
//     sequence whose prompt starts with the same blocks finds them by lookup() and skips
//     their prefill. A published block whose count drops to 0 stays cached (its rows
//     intact) on an LRU list; allocate() takes free blocks first and then evicts the
//     least recently used cached block.
// Every block is in exactly one state: free (count 0, on the free list), used (count > 0,
// published or not) or cached (count 0, published, on the LRU list). check() verifies
// that and the counts against the block tables that exist.
// A KvPool is used from one thread at a time.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache.h"

namespace kvscope {

struct KvPoolConfig {
  KvShape shape;
  KvTypes types;
  int block_size = 16;  // positions per block: 8, 16 or 32
  int n_blocks = 0;
};

// The block sizes a pool accepts, for messages: "8, 16, 32".
const char* kv_block_size_choices();
bool kv_block_size_ok(int block_size);
// Bytes of one block: block_size positions' K and V rows in every layer.
uint64_t kv_block_bytes(const KvPoolConfig& c);
// Blocks that fit in `mib` MiB (at least 0).
int kv_pool_blocks_for_mib(const KvPoolConfig& c, uint64_t mib);
// An error unless `c` has at least one block of an accepted size (what every backend's
// pool checks before it allocates).
Status kv_pool_config_check(const KvPoolConfig& c);
// Blocks that hold `positions` positions.
inline int kv_blocks_for(int positions, int block_size) {
  return (positions + block_size - 1) / block_size;
}

struct KvPoolCounts {
  int used = 0, free = 0, cached = 0, total = 0;
};

class KvPool {
 public:
  virtual ~KvPool() = default;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  const KvPoolConfig& config() const { return cfg_; }
  int block_size() const { return cfg_.block_size; }
  int n_blocks() const { return cfg_.n_blocks; }

  // A block for the caller, count 1: the lowest free block, else the least recently used
  // cached one (which leaves the prefix cache). An error when every block is in use.
  Expected<int> allocate();
  void ref(int block);
  // Drops one reference; at 0 the block becomes cached (if published) or free.
  void unref(int block);
  int ref_count(int block) const { return ref_[size_t(block)]; }
  // Blocks allocate() can hand out before failing: free + cached.
  int available() const { return int(free_.size() + lru_.size()); }
  KvPoolCounts counts() const;

  // --- Prefix cache.
  // The hash of a full block of token ids whose preceding block hashed to `parent` (0 for
  // the first block), salted with the pool's configuration (shape, types, block size) and
  // `salt` (what else changes the rows: the model, the rules).
  uint64_t chain_hash(uint64_t parent, const int32_t* ids, int n, uint64_t salt) const;
  // The block published under `hash`, with a reference taken for the caller (a cached block
  // leaves the LRU list); -1 when there is none.
  int lookup(uint64_t hash);
  // The block published under `hash` (-1: none), no reference taken.
  int find(uint64_t hash) const {
    auto it = by_hash_.find(hash);
    return it == by_hash_.end() ? -1 : it->second;
  }
  // Publishes a full, used block under `hash`. Nothing happens when the hash already names
  // another block or the block is already published.
  void publish(int block, uint64_t hash);
  bool published(int block) const { return has_hash_[size_t(block)]; }
  // Count 0 and kept for the prefix cache (on the LRU list): what allocate() may evict.
  bool cached(int block) const { return lru_at_[size_t(block)] != lru_.end(); }

  // Copies block src's rows to block dst in every layer (copy-on-write).
  Status copy_block(int dst, int src);
  // A row move: n consecutive physical slots from src.. to dst.. (within one block each).
  struct RowMove {
    int dst = 0, src = 0, n = 0;
  };
  // Copies the K and V rows of each move in every layer, one move after the other, in
  // order (a later move may read what an earlier one wrote; the slots of one move do not
  // overlap). A context shift moves rows this way.
  Status move_rows(const std::vector<RowMove>& moves);

  // The invariants, against every block table that exists (-1 entries are holes): each
  // block's count equals the number of table entries that point to it; every block is in exactly one state; the
  // hash index and the published flags agree. The first violation, as an error.
  Status check(const std::vector<const std::vector<int32_t>*>& tables) const;

 protected:
  explicit KvPool(KvPoolConfig cfg);
  // Storage: copy block src's K and V rows to block dst in every layer.
  virtual Status do_copy_block(int dst, int src) = 0;
  // Storage: move_rows() (moves already checked to lie inside the pool).
  virtual Status do_move_rows(const std::vector<RowMove>& moves) = 0;

 private:
  KvPoolConfig cfg_;
  uint64_t cfg_hash_ = 0;
  std::vector<int> ref_;            // [n_blocks]
  std::vector<int32_t> free_;       // a stack, lowest id on top
  std::vector<char> on_free_;       // [n_blocks]
  std::list<int32_t> lru_;          // cached blocks, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_at_;  // [n_blocks], lru_.end() if not cached
  std::vector<char> has_hash_;      // [n_blocks]
  std::vector<uint64_t> hash_;      // [n_blocks]
  std::unordered_map<uint64_t, int32_t> by_hash_;
};

}  // namespace kvscope
