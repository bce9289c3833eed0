// kv_cache.h — the KV cache: per layer K and V rows in slots, and which position each
// slot holds.
//
// Storage (backend memory, owned by the backend's subclass): per layer l, K and V each
// [Hkv][n_slots(l)][D], K rows in types().k and V rows in types().v (chosen apart; a row of
// D values takes kv_row_bytes(type, D) bytes, so block types with 32 values along D fit
// the same layout). Slots are not positions: slot_pos(l)[s] is the position slot s holds
// (-1: empty), and attention, the scene (held_ranges) and KV_CACHE (bytes_used) all read
// that map. The engine keeps the map on the host; a backend whose kernels need it keeps
// its own copy in step (its K/V store writes the entries it fills; relayout() sends it
// the whole map).
//
// Which positions a layer keeps is the layer's KvLayerRule:
//   - window/sink: the attention mask. Query q sees key k iff k <= q and (window == 0 or
//     q - k < window or k < sink). Gemma 3's local layers: window 512. NO CACHE applies
//     the same rule to its scratch cache, so both modes see the same keys.
//   - keep: 0 holds every position; otherwise the layer holds its first `sink` positions
//     and the last `keep` ones (a ring: position p >= sink goes to slot
//     sink + (p - sink) % (n_slots - sink)). A ring of `keep` slots is exact for one-token
//     decode when keep >= window; a T-token batch needs up to keep - 1 + T slots, so
//     begin() widens the ring for the batch and end() trims it back (trim = true).
// A KvPolicy turns the model's per-layer windows into rules (kv_cache_config()).
//
// The forward's protocol for T new positions pos0 .. pos0+T-1 (pos0 == length()):
//   begin(pos0, T)  makes room in every layer without dropping a key one of the T queries
//                   can see (growing or re-laying-out slots through relayout()), and
//                   records the new positions in the map;
//   backend kv_write / rope_kv_write store the rows at slot_of(l, p);
//   end()           length() = pos0 + T; rings are trimmed to `keep` positions.
// Paged (a cache made over a KvPool, engine/kv_pool.h): the layers fall into groups
// (kv_layer_groups: layers with the same window and sink, cut into groups of equal size,
// the pool's layers per block), each with its own block table; a logical slot s of layer
// l lives in physical slot physical_slot(l, s) = blocks(g)[s / B] * B + s % B of the
// pool's storage, g the layer's group and B the block size. Slots are positions: there
// are no rings. A rule with keep > 0 (a windowed layer that keeps only what its window
// sees) makes end() give back the blocks of its group wholly outside the window, so such
// a layer holds its window plus at most two partly used blocks. begin() takes blocks from
// the pool as positions arrive and copies, before a write, any block another table also
// points to or the prefix cache holds (copy-on-write); adopt() shares blocks of a prefix
// (another sequence's, or the pool's prefix cache) without computing them;
// drop_outside_windows() gives back the blocks of every windowed group that no later
// query can see (a hole, -1, in their table); release() and the destructor return every
// block. shift() moves rows inside the pool's blocks (KvPool::move_rows). KV_CACHE
// (bytes_used) counts the bytes of the blocks held, partly used ones whole. A model
// without windows has one group: a block id is then the same in every layer.
// Extension points (KV element types, sink + window, context shift): add the dtype to
// KvDtype and kv_row_bytes() and teach the backends' row load/store; a policy fills
// KvLayerRule (sink, window, keep) in kv_cache_config(); the context shift is shift()
// (the map renumbered, rows moved through relayout()) plus the backend's kv_rerotate().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvscope {

// Element type of cached K or V rows; the values are the ggml type ids. q8_0 and q4_0 are
// the GGUF blocks of 32 values along D (34 and 18 bytes: an fp16 scale and the quants;
// engine/kv_quant.h), so D must be a multiple of 32 for them.
enum class KvDtype : int { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8 };
const char* kv_dtype_name(KvDtype t);  // "f32", "f16", "q8_0", "q4_0"
// Parses a name from kv_dtype_name(); false when unknown.
bool kv_dtype_parse(const std::string& name, KvDtype* out);
// The accepted names, for messages: "f32, f16, q8_0, q4_0".
const char* kv_dtype_choices();
// Bytes of one cached row of D values, block overhead included; 0 when D does not fit the
// type's blocks.
uint64_t kv_row_bytes(KvDtype t, int D);

struct KvTypes {
  KvDtype k = KvDtype::F16;
  KvDtype v = KvDtype::F16;
  bool operator==(const KvTypes&) const = default;
};
// "f16" when K and V agree, else "k=f16,v=f32".
std::string kv_types_name(KvTypes t);

struct KvShape {
  int n_layer = 0;    // L
  int n_head_kv = 0;  // Hkv
  int head_dim = 0;   // D
};

// Bytes of one position's K and V rows in one layer (all kv heads).
uint64_t kv_position_bytes(const KvShape& s, KvTypes t);

struct KvLayerRule {
  int window = 0;  // attention window W (0: all earlier positions)
  int sink = 0;    // positions [0, sink) stay visible and held whatever the window
  int keep = 0;    // positions >= sink held: the last `keep` (0: all)
  bool visible(int key_pos, int query_pos) const {
    return key_pos <= query_pos && (window == 0 || query_pos - key_pos < window || key_pos < sink);
  }
};

// Which positions caches keep. Full: every position of every layer (windowed layers
// still mask). ModelWindow: a windowed layer keeps only what its window can see.
enum class KvPolicy { Full, ModelWindow };
const char* kv_policy_name(KvPolicy p);  // "full", "window"

struct KvCacheConfig {
  KvShape shape;
  KvTypes types;
  std::vector<KvLayerRule> layers;  // [L]
  // Rings shrink back to `keep` after a batch. Off for NO CACHE's scratch cache, which
  // holds everything it computed and is then thrown away.
  bool trim = true;
};
// A config where every layer holds everything with no window (tests, tools).
KvCacheConfig kv_config_full(KvShape shape, KvTypes types);
// NO CACHE's scratch cache for `c`: the same attention masks, every position held, no trim.
KvCacheConfig kv_config_scratch(KvCacheConfig c);

// A run of positions [begin, end).
struct KvRange {
  int begin = 0, end = 0;
  bool operator==(const KvRange&) const = default;
};

// A run of n rows copied from old slot src.. to new slot dst.. during a relayout.
class KvPool;

// How a paged cache's layers share blocks: layers with the same (window, sink, keep) in groups
// of `size` layers (the greatest common divisor of those counts), so that every block of
// the pool holds the same bytes whatever group it serves.
struct KvLayerGroups {
  int size = 0;                  // layers per group (per block)
  std::vector<int> group_of;     // [L] the layer's group
  std::vector<int> index_of;     // [L] the layer's index within its group
  std::vector<int> window, sink, keep;  // [groups] the rule of the group's layers
  int count() const { return int(window.size()); }
};
KvLayerGroups kv_layer_groups(const KvCacheConfig& c);

struct KvMove {
  int dst = 0, src = 0, n = 0;
};
// relayout()'s `from` as runs of consecutive slots (what a backend copies).
std::vector<KvMove> kv_moves(const std::vector<int32_t>& from);

class KvCache {
 public:
  explicit KvCache(KvCacheConfig config);
  // A paged cache over `pool` (whose shape and types must be config's).
  KvCache(KvCacheConfig config, std::shared_ptr<KvPool> pool);
  virtual ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return cfg_; }
  const KvShape& shape() const { return cfg_.shape; }
  KvTypes types() const { return cfg_.types; }
  const KvLayerRule& rule(int layer) const { return cfg_.layers[size_t(layer)]; }

  // Positions [0, length()) have gone through the cache.
  int length() const { return length_; }
  int n_slots(int layer) const { return int(pos_[size_t(layer)].size()); }
  // [n_slots(layer)]: the position each slot holds, -1 when empty.
  const std::vector<int32_t>& slot_pos(int layer) const { return pos_[size_t(layer)]; }
  // The slot position `pos` is (or would be) stored in under the current layout.
  int slot_of(int layer, int pos) const;
  // Slots of `layer` in ascending order of the positions they hold (empty slots left out),
  // into `out` (its capacity reused: attention calls this at every step of a wrapped ring).
  void slots_by_position(int layer, std::vector<int32_t>& out) const;
  int held(int layer) const;                          // slots holding a position
  std::vector<KvRange> held_ranges(int layer) const;  // ascending, disjoint

  // Bytes of the rows `layer` holds; paged: of the blocks its group holds (a partly used
  // block counts whole), the layer's share of them.
  uint64_t layer_bytes(int layer) const;
  uint64_t bytes_used() const;            // all layers: what KV_CACHE shows
  // The rows of the positions held, without the unused rest of their blocks (for a cache
  // that is not paged, bytes_used()).
  uint64_t rows_bytes() const;
  uint64_t bytes_allocated() const;       // every slot, held or not

  // The forward's protocol (see the file comment). begin() fails when pos0 != length().
  Status begin(int pos0, int T);
  Status end();
  // After a failed forward: forgets the positions begin() recorded (a paged cache gives
  // back the blocks it took for them). Rows a ring overwrote for them are gone, so the
  // caller should treat the cache as lost. A failed begin() does this itself.
  void cancel();
  // Context shift: forgets positions [first, first + n) in every layer and renumbers every
  // later position p as p - n (its rows move to that position's slot); length() drops by
  // n. The moved K rows still carry RoPE at their old positions: the caller re-rotates
  // them by -n (Backend::kv_rerotate). Errors: inside a begin()/end(), a range outside
  // [0, length()).
  Status shift(int first, int n);

  // --- Paged caches (the rest answer as one contiguous block, one group).
  // What changed, for paged_changed(). Grown: begin() took new blocks at the ends of the
  // tables for the positions it records, and nothing else changed since the last call
  // succeeded: the slot maps differ only at those positions (which the K/V writes of this
  // forward set) and in new empty slots. Any: anything else (the tables or maps may differ
  // anywhere).
  enum class PagedChange { Any, Grown };
  bool paged() const { return pool_ != nullptr; }
  KvPool* pool() const { return pool_.get(); }
  int n_groups() const { return pool_ ? int(tables_.size()) : 1; }
  int group_of(int layer) const { return pool_ ? groups_.group_of[size_t(layer)] : 0; }
  int layer_in_group(int layer) const { return pool_ ? groups_.index_of[size_t(layer)] : layer; }
  const KvLayerGroups& groups() const { return groups_; }
  // Group g's block table: logical block i -> pool block (-1: given back, outside the
  // group's window).
  const std::vector<int32_t>& blocks(int g = 0) const { return tables_[size_t(g)]; }
  // Blocks the tables hold (holes not counted).
  int held_blocks() const;
  int physical_slot(int layer, int slot) const {
    if (!pool_) return slot;
    const int b = tables_[size_t(groups_.group_of[size_t(layer)])][size_t(slot / block_)];
    return b < 0 ? -1 : b * block_ + slot % block_;
  }
  int physical_slot(int slot) const { return physical_slot(0, slot); }
  // Copies-on-write done by begin() since the cache was made.
  int cow_copies() const { return cow_copies_; }
  // On an empty paged cache: takes a reference on each block of `tables` (one per group),
  // which hold positions [0, n) (the last block possibly in part; a windowed group may
  // have holes, -1, for blocks no query after n can see), and makes them the cache's
  // first n positions. A later write into a block still shared copies it first.
  Status adopt_groups(const std::vector<std::vector<int32_t>>& tables, int n);
  // The same for a cache of one group.
  Status adopt(const std::vector<int32_t>& blocks, int n);
  // Windowed groups give back the blocks wholly outside what a query at length() or later
  // can see (and not among the sinks). Returns the number of blocks given back.
  Expected<int> drop_outside_windows();
  // Gives every block back to the pool; the cache is empty (length 0) afterwards.
  void release();
  // Paged: while held, end() gives back no block of a layer that keeps only its window (a
  // speculative verification writes rows it may roll back, and a rollback must find the
  // blocks a query at the shorter length sees). Releasing the hold gives back what end()
  // would have, at the current length.
  Status hold_window_drops(bool hold);
  // Forgets positions [n, length()): blocks wholly past n go back to the pool. An error
  // on a ring, or when a windowed group already gave back blocks a query at n would see.
  Status truncate(int n);

 protected:
  // Storage hook: lay `layer` out in n_slots slots where new slot s takes the K/V rows of
  // old slot from[s] (-1: nothing; contents undefined). slot_pos(layer) already shows the
  // new layout when this is called. Also called once per layer by the constructor's
  // owner through init_storage() to allocate the first layout.
  virtual Status relayout(int layer, int n_slots, const std::vector<int32_t>& from) = 0;
  // Paged caches only, instead of relayout(): the block table or the slot maps changed
  // (blocks taken, copied, adopted or given back; slot_pos() and blocks() show the new
  // state). A backend that keeps its own copy of them refreshes it here.
  virtual Status paged_changed(PagedChange) { return Status::Ok(); }
  // Allocates every layer with `slots` empty slots (call from the subclass's factory).
  Status init_storage(int slots);

 private:
  // New layout of `layer` with n_slots slots keeping the positions for which keep(p).
  template <class Keep>
  Status resize(int layer, int n_slots, Keep keep);
  // New layout of `layer` with n_slots slots where position p becomes to(p) (-1: dropped).
  template <class To>
  Status relocate(int layer, int n_slots, To to);

  // Paged: blocks for n_slots slots in the table (taken from the pool as needed).
  Status ensure_blocks(int n_slots);
  // Paged: paged_changed(change), or with Any when something else changed since the last
  // refresh that succeeded.
  Status refresh_paged(PagedChange change = PagedChange::Any);
  // Paged: makes block i of group g's table this cache's alone: a copy when another table
  // shares it or the prefix cache holds it; a fresh block for a hole when fill_hole.
  Status own_block(int g, int i, bool fill_hole);
  // Paged: copies every shared block that positions [pos0, end) fall in.
  Status copy_shared(int pos0, int end);
  // Paged shift(): rows move inside the pool's blocks.
  Status shift_paged(int first, int n);
  // Paged: drop_outside_windows(), for every windowed group or only those whose layers
  // keep just their window (keep > 0).
  Expected<int> drop_outside(bool keeping_only);
  // Paged: gives back the blocks wholly past position n; every layer keeps the slots of
  // the blocks left.
  void drop_blocks_past(int n);
  // Paged: the slot maps of group g's layers, positions [first, end) marked empty.
  void clear_group_slots(int g, int first, int end);

  KvCacheConfig cfg_;
  std::shared_ptr<KvPool> pool_;  // paged only
  int block_ = 1;                 // the pool's block size (1 when not paged)
  KvLayerGroups groups_;          // paged only
  std::vector<std::vector<int32_t>> tables_{1};  // per group; one empty table when not paged
  int cow_copies_ = 0;
  std::vector<std::vector<int32_t>> pos_;  // [L][n_slots]
  int length_ = 0;
  int pending_end_ = -1;  // pos0 + T between begin() and end()
  bool hold_drops_ = false;
  bool defer_changed_ = false;  // paged, inside begin(): growth refreshes the backend once
  bool changed_pending_ = false;
  // Paged: the last paged_changed() succeeded and only begin()'s growth came after it.
  bool paged_synced_ = false;
};

}  // namespace kvscope
