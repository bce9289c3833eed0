// serving_codec.cpp — the serving run's record payloads (SRVM, SRVS) to and from bytes
// (serving_record.h; the byte layout is in docs/run_file.md, "Serving runs").
//
// An SRVS record is a delta: it names the tiles and lanes whose fields changed (a lane's
// token ids and pieces as "keep the first k, append these"), the waiting queue and totals
// only when they changed, and the history as "keep the first k points, append these". Lists
// that grow list every new entry, so the size of anything the decoder allocates is bounded by
// the bytes really in the payload.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "app/core/record_io.h"
#include "app/core/serving_record.h"

namespace kvscope::app {
namespace {

using detail::Reader;
using detail::Writer;

constexpr int64_t kIntMin = std::numeric_limits<int32_t>::min();
constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

double fin(double v) {
  return std::isfinite(v) ? v : 0.0;
}
float fin(float v) {
  return std::isfinite(v) ? v : 0.0f;
}

// ---- what changed ------------------------------------------------------------------------

bool tile_equal(const PoolTile& a, const PoolTile& b) {
  return a.state == b.state && a.refs == b.refs && a.owners == b.owners && a.logical == b.logical &&
         a.first_pos == b.first_pos && a.n_pos == b.n_pos && a.hash_hits == b.hash_hits &&
         a.published == b.published && a.flash == b.flash;
}

// Tokens drafted for one sequence in one step (speculative decoding drafts at most 15).
constexpr int64_t kMaxDrafted = 64;

bool same_double(double a, double b) {
  return fin(a) == fin(b);
}

// Compares what the file stores of a lane (attention only when it is stored).
bool lane_equal(const Lane& a, const Lane& b, bool with_attention) {
  return a.seq == b.seq && a.request == b.request && a.sample == b.sample && a.parent == b.parent &&
         a.state == b.state && a.color == b.color && a.prompt_tokens == b.prompt_tokens &&
         a.cached_tokens == b.cached_tokens && a.computed == b.computed && a.ids == b.ids &&
         a.pieces == b.pieces && a.table == b.table && a.step_tokens == b.step_tokens &&
         a.step_prompt == b.step_prompt && a.arrival_step == b.arrival_step &&
         a.preemptions == b.preemptions && same_double(a.ttft_ms, b.ttft_ms) &&
         same_double(a.tokens_per_s, b.tokens_per_s) && a.stop == b.stop &&
         a.drafted == b.drafted && a.accepted == b.accepted &&
         (!with_attention || a.attention == b.attention);
}

bool totals_equal(const SchedulerStats& a, const SchedulerStats& b) {
  auto ints = [](const SchedulerStats& s) {
    return std::tie(s.steps, s.finished, s.peak_kv_bytes, s.unshared_kv_bytes,
                    s.contiguous_kv_bytes, s.prefix_hit_tokens, s.prefill_tokens, s.decode_tokens,
                    s.preemptions, s.cow_copies, s.ttft_hits, s.ttft_misses);
  };
  return ints(a) == ints(b) && same_double(a.slot_utilization, b.slot_utilization) &&
         same_double(a.contiguous_utilization, b.contiguous_utilization) &&
         same_double(a.internal_fragmentation, b.internal_fragmentation) &&
         same_double(a.ms, b.ms) && same_double(a.ttft_hit_ms, b.ttft_hit_ms) &&
         same_double(a.ttft_miss_ms, b.ttft_miss_ms);
}

bool point_equal(const ServingPoint& a, const ServingPoint& b) {
  auto ints = [](const ServingPoint& p) {
    return std::tie(p.step, p.running, p.waiting, p.finished, p.used, p.free, p.cached,
                    p.prefill_tokens, p.decode_tokens, p.drafted, p.accepted);
  };
  return ints(a) == ints(b) && same_double(a.slot_utilization, b.slot_utilization) &&
         same_double(a.contiguous_utilization, b.contiguous_utilization) &&
         same_double(a.fragmentation, b.fragmentation) &&
         same_double(a.prefix_hit_rate, b.prefix_hit_rate) &&
         same_double(a.tokens_per_s, b.tokens_per_s) && same_double(a.ms, b.ms);
}

// Leading entries two lists share.
template <class T>
size_t common_prefix(const std::vector<T>& a, const std::vector<T>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// ---- encoding ----------------------------------------------------------------------------

void put_tile(Writer& w, uint32_t index, const PoolTile& t) {
  w.u32(index);
  w.u8(uint8_t(t.state));
  w.i32(t.refs);
  w.u32(uint32_t(t.owners.size()));
  for (int o : t.owners) w.i32(o);
  w.i32(t.logical);
  w.i32(t.first_pos);
  w.i32(t.n_pos);
  w.i32(t.hash_hits);
  w.u8(t.published);
  w.u8(uint8_t(t.flash));
}

void put_attention(Writer& w, const std::vector<float>& a, AttnEncoding enc) {
  if (enc == AttnEncoding::None) {
    w.u32(0);
    return;
  }
  w.u32(uint32_t(a.size()));
  for (float v : a) {
    if (enc == AttnEncoding::F16) {
      uint16_t h = fp32_to_fp16(fin(v));
      w.put(&h, 2);
    } else {
      w.f32(fin(v));
    }
  }
}

void put_lane(Writer& w, uint32_t index, const Lane* prev, const Lane& l, AttnEncoding enc) {
  w.u32(index);
  for (int v : {l.seq, l.request, l.sample, l.parent}) w.i32(v);
  w.u8(uint8_t(l.state));
  for (int v : {l.color, l.prompt_tokens, l.cached_tokens, l.computed}) w.i32(v);
  const size_t keep_ids = prev ? common_prefix(prev->ids, l.ids) : 0;
  w.u32(uint32_t(keep_ids));
  w.u32(uint32_t(l.ids.size() - keep_ids));
  w.put(l.ids.data() + keep_ids, (l.ids.size() - keep_ids) * 4);
  const size_t keep_pieces = prev ? common_prefix(prev->pieces, l.pieces) : 0;
  w.u32(uint32_t(keep_pieces));
  w.u32(uint32_t(l.pieces.size() - keep_pieces));
  for (size_t i = keep_pieces; i < l.pieces.size(); ++i) w.str(l.pieces[i]);
  const size_t keep_table = prev ? common_prefix(prev->table, l.table) : 0;
  w.u32(uint32_t(keep_table));
  w.u32(uint32_t(l.table.size() - keep_table));
  w.put(l.table.data() + keep_table, (l.table.size() - keep_table) * 4);
  w.i32(l.step_tokens);
  w.u8(l.step_prompt);
  w.i32(l.arrival_step);
  w.i32(l.preemptions);
  put_attention(w, l.attention, enc);
  w.f64(fin(l.ttft_ms));
  w.f64(fin(l.tokens_per_s));
  w.str(l.stop);
  w.u32(uint32_t(l.drafted.size()));
  for (const std::string& d : l.drafted) w.str(d);
  w.i32(l.accepted);
}

void put_point(Writer& w, const ServingPoint& p) {
  for (int v : {p.step, p.running, p.waiting, p.finished, p.used, p.free, p.cached}) w.i32(v);
  for (double v :
       {p.slot_utilization, p.contiguous_utilization, p.fragmentation, p.prefix_hit_rate})
    w.f64(fin(v));
  w.i32(p.prefill_tokens);
  w.i32(p.decode_tokens);
  w.f64(fin(p.tokens_per_s));
  w.f64(fin(p.ms));
  w.i32(p.drafted);
  w.i32(p.accepted);
}

void put_totals(Writer& w, const SchedulerStats& t) {
  w.i32(t.steps);
  w.i32(t.finished);
  for (uint64_t v : {t.peak_kv_bytes, t.unshared_kv_bytes, t.contiguous_kv_bytes}) w.u64(v);
  for (double v : {t.slot_utilization, t.contiguous_utilization, t.internal_fragmentation})
    w.f64(fin(v));
  for (uint64_t v : {t.prefix_hit_tokens, t.prefill_tokens, t.decode_tokens}) w.u64(v);
  w.i32(t.preemptions);
  w.i32(t.cow_copies);
  for (double v : {t.ms, t.ttft_hit_ms, t.ttft_miss_ms}) w.f64(fin(v));
  w.i32(t.ttft_hits);
  w.i32(t.ttft_misses);
}

// ---- decoding ----------------------------------------------------------------------------

// Bytes of the smallest tile / lane entry (empty lists and strings): bounds a count before
// anything is allocated for it.
constexpr uint64_t kMinTileBytes = 4 + 1 + 4 + 4 + 4 * 4 + 2;
// index; seq..parent; state; color..computed; ids, pieces, table (keep, added each);
// step_tokens, step_prompt, arrival_step, preemptions; attention count; ttft, rate; stop;
// drafted count, accepted.
constexpr uint64_t kMinLaneBytes =
    4 + 16 + 1 + 16 + 8 + 8 + 8 + 4 + 1 + 4 + 4 + 4 + 8 + 8 + 4 + 4 + 4;
constexpr uint64_t kPointBytes = 7 * 4 + 4 * 8 + 2 * 4 + 2 * 8 + 2 * 4;
constexpr uint64_t kMinEventBytes = 1 + 4 + 4 + 4;

void get_tile(Reader& r, const ServingMeta& m, PoolTile& t) {
  t.state = TileState(r.u8("tile.state", 0, int(TileState::Cached)));
  t.refs = r.i32("tile.refs", 0, kIntMax);
  const uint32_t n_owners = r.u32("tile.owners.count", 0, kServingFileMaxLanes);
  if (r.fits("tile.owners", n_owners, 4)) {
    t.owners.resize(n_owners);
    for (int& o : t.owners) o = r.i32("tile.owners", 0, kIntMax);
  }
  t.logical = r.i32("tile.logical", -1, kIntMax);
  t.first_pos = r.i32("tile.first_pos", 0, kIntMax);
  t.n_pos = r.i32("tile.n_pos", 0, std::max(m.block_size, 0));
  t.hash_hits = r.i32("tile.hash_hits", 0, kIntMax);
  t.published = r.flag("tile.published");
  t.flash = TileFlash(r.u8("tile.flash", 0, int(TileFlash::Released)));
}

// Applies "keep the first k, then `added` more" to a list, after checking both.
template <class T, class Get>
void get_appended(Reader& r, const char* keep_field, const char* list_field, uint64_t min_bytes,
                  std::vector<T>& v, Get get) {
  const uint32_t keep = r.u32(keep_field, 0, int64_t(v.size()));
  const uint32_t added = r.u32(list_field, 0, kRunMaxPositions - int64_t(keep));
  if (!r.fits(list_field, added, min_bytes)) return;
  v.resize(keep);
  v.reserve(size_t(keep) + added);
  for (uint32_t i = 0; i < added && r.ok(); ++i) v.push_back(get());
}

void get_lane(Reader& r, const ServingMeta& m, Lane& l) {
  l.seq = r.i32("lane.seq", 0, kIntMax);
  l.request = r.i32("lane.request", 0, kIntMax);
  l.sample = r.i32("lane.sample", 0, kIntMax);
  l.parent = r.i32("lane.parent", -1, kIntMax);
  l.state = LaneState(r.u8("lane.state", 0, int(LaneState::Failed)));
  l.color = r.i32("lane.color", kIntMin, kIntMax);
  l.prompt_tokens = r.i32("lane.prompt_tokens", 0, kRunMaxPositions);
  l.cached_tokens = r.i32("lane.cached_tokens", 0, kRunMaxPositions);
  l.computed = r.i32("lane.computed", 0, kRunMaxPositions);
  get_appended(r, "lane.ids.keep", "lane.ids", 4, l.ids,
               [&] { return int32_t(r.i32("lane.ids", 0, kIntMax)); });
  get_appended(r, "lane.pieces.keep", "lane.pieces", 4, l.pieces,
               [&] { return r.str("lane.pieces", false); });
  get_appended(r, "lane.table.keep", "lane.table", 4, l.table,
               [&] { return int32_t(r.i32("lane.table", -1, int64_t(m.n_blocks) - 1)); });
  l.step_tokens = r.i32("lane.step_tokens", 0, kRunMaxPositions);
  l.step_prompt = r.flag("lane.step_prompt");
  l.arrival_step = r.i32("lane.arrival_step", 0, kIntMax);
  l.preemptions = r.i32("lane.preemptions", 0, kIntMax);
  const int64_t max_attn = m.attention == AttnEncoding::None ? 0 : kRunMaxPositions;
  const uint32_t n_attn = r.u32("lane.attention.count", 0, max_attn);
  l.attention.clear();
  if (r.ok() && n_attn > 0) {
    constexpr float kHuge = std::numeric_limits<float>::max();
    r.floats("lane.attention", n_attn, m.attention, -kHuge, kHuge, &l.attention);
  }
  l.ttft_ms = r.f64_finite("lane.ttft_ms");
  l.tokens_per_s = r.f64_finite("lane.tokens_per_s");
  l.stop = r.str("lane.stop", false);
  const uint32_t n_drafted = r.u32("lane.drafted.count", 0, kMaxDrafted);
  l.drafted.clear();
  for (uint32_t i = 0; i < n_drafted && r.ok(); ++i) l.drafted.push_back(r.str("lane.drafted", false));
  l.accepted = r.i32("lane.accepted", 0, int64_t(n_drafted));
}

ServingPoint get_point(Reader& r) {
  ServingPoint p;
  for (int* v : {&p.step, &p.running, &p.waiting, &p.finished, &p.used, &p.free, &p.cached})
    *v = r.i32("history.count_fields", kIntMin, kIntMax);
  p.slot_utilization = r.f64_finite("history.slot_utilization");
  p.contiguous_utilization = r.f64_finite("history.contiguous_utilization");
  p.fragmentation = r.f64_finite("history.fragmentation");
  p.prefix_hit_rate = r.f64_finite("history.prefix_hit_rate");
  p.prefill_tokens = r.i32("history.prefill_tokens", kIntMin, kIntMax);
  p.decode_tokens = r.i32("history.decode_tokens", kIntMin, kIntMax);
  p.tokens_per_s = r.f64_finite("history.tokens_per_s");
  p.ms = r.f64_finite("history.ms");
  p.drafted = r.i32("history.drafted", 0, kIntMax);
  p.accepted = r.i32("history.accepted", 0, p.drafted);
  return p;
}

void get_totals(Reader& r, SchedulerStats& t) {
  t.steps = r.i32("totals.steps", kIntMin, kIntMax);
  t.finished = r.i32("totals.finished", kIntMin, kIntMax);
  t.peak_kv_bytes = r.u64("totals.peak_kv_bytes");
  t.unshared_kv_bytes = r.u64("totals.unshared_kv_bytes");
  t.contiguous_kv_bytes = r.u64("totals.contiguous_kv_bytes");
  t.slot_utilization = r.f64_finite("totals.slot_utilization");
  t.contiguous_utilization = r.f64_finite("totals.contiguous_utilization");
  t.internal_fragmentation = r.f64_finite("totals.internal_fragmentation");
  t.prefix_hit_tokens = r.u64("totals.prefix_hit_tokens");
  t.prefill_tokens = r.u64("totals.prefill_tokens");
  t.decode_tokens = r.u64("totals.decode_tokens");
  t.preemptions = r.i32("totals.preemptions", kIntMin, kIntMax);
  t.cow_copies = r.i32("totals.cow_copies", kIntMin, kIntMax);
  t.ms = r.f64_finite("totals.ms");
  t.ttft_hit_ms = r.f64_finite("totals.ttft_hit_ms");
  t.ttft_miss_ms = r.f64_finite("totals.ttft_miss_ms");
  t.ttft_hits = r.i32("totals.ttft_hits", kIntMin, kIntMax);
  t.ttft_misses = r.i32("totals.ttft_misses", kIntMin, kIntMax);
}

// The changed entries of a list (tiles or lanes): u32 new size, u32 changed count, then the
// entries by ascending index; every index at or past the old size must be listed. `get`
// decodes one entry into its slot.
template <class T, class Get>
void get_changed(Reader& r, const char* what, int64_t max_size, uint64_t min_bytes,
                 std::vector<T>& v, Get get) {
  const std::string size_field = std::string(what) + ".size";
  const std::string changed_field = std::string(what) + ".changed";
  const std::string index_field = std::string(what) + ".index";
  const uint32_t size = r.u32(size_field.c_str(), 0, max_size);
  const uint32_t changed = r.u32(changed_field.c_str(), 0, size);
  if (!r.fits(changed_field.c_str(), changed, min_bytes)) return;
  const size_t old_size = v.size();
  if (size > old_size && size - old_size > changed) {
    r.fail(size_field.c_str(), "grows from " + std::to_string(old_size) + " to " +
                                   std::to_string(size) + " but only " + std::to_string(changed) +
                                   " entries are listed (every new entry must be)");
    return;
  }
  v.resize(size);
  int64_t prev = -1;
  size_t new_listed = 0;
  for (uint32_t i = 0; i < changed && r.ok(); ++i) {
    const uint32_t index = r.u32(index_field.c_str(), prev + 1, int64_t(size) - 1);
    if (!r.ok()) break;
    prev = index;
    if (index >= old_size) {
      ++new_listed;
      v[index] = T{};
    }
    get(v[index]);
  }
  if (r.ok() && size > old_size && new_listed != size - old_size)
    r.fail(index_field.c_str(),
           "the entries past the old size " + std::to_string(old_size) + " are not all listed");
}

}  // namespace

bool ServingMeta::operator==(const ServingMeta& o) const {
  auto key = [](const ServingMeta& m) {
    return std::tie(m.producer, m.model, m.attention, m.run, m.block_size, m.n_blocks,
                    m.max_batch_tokens, m.max_seqs, m.context, m.prefix_caching, m.n_requests);
  };
  return key(*this) == key(o);
}

// ---- SRVM --------------------------------------------------------------------------------

std::vector<uint8_t> encode_serving_meta(const ServingMeta& m) {
  Writer w;
  w.str(m.producer);
  detail::put_model_facts(w, m.model);
  w.u8(uint8_t(m.attention));
  w.u64(m.run);
  for (int v : {m.block_size, m.n_blocks, m.max_batch_tokens, m.max_seqs, m.context}) w.i32(v);
  w.u8(m.prefix_caching);
  w.i32(m.n_requests);
  return std::move(w.bytes());
}

Expected<ServingMeta> decode_serving_meta(const uint8_t* p, size_t n) {
  Reader r(p, n);
  ServingMeta m;
  m.producer = r.str("producer", true);
  m.model = detail::get_model_facts(r, 0);
  m.attention = AttnEncoding(r.u8("attention", 0, 2));
  m.run = r.u64("run");
  m.block_size = r.i32("block_size", 0, 1 << 20);
  m.n_blocks = r.i32("n_blocks", 0, kServingFileMaxBlocks);
  m.max_batch_tokens = r.i32("max_batch_tokens", 0, kIntMax);
  m.max_seqs = r.i32("max_seqs", 0, kIntMax);
  m.context = r.i32("context", 0, kIntMax);
  m.prefix_caching = r.flag("prefix_caching");
  m.n_requests = r.i32("n_requests", 0, kIntMax);
  if (Status st = r.finish(); !st.ok()) return st.error();
  return m;
}

ServingSnapshot serving_snapshot_start(const ServingMeta& m) {
  ServingSnapshot s;
  s.run = m.run;
  s.step = -1;  // below any recorded step
  s.block_size = m.block_size;
  s.n_blocks = m.n_blocks;
  s.max_batch_tokens = m.max_batch_tokens;
  s.max_seqs = m.max_seqs;
  s.context = m.context;
  s.prefix_caching = m.prefix_caching;
  s.n_requests = m.n_requests;
  return s;
}

// ---- SRVS --------------------------------------------------------------------------------

std::vector<uint8_t> encode_serving_step(const ServingSnapshot* prev, const ServingSnapshot& cur,
                                         AttnEncoding enc) {
  static const ServingSnapshot kEmpty;
  const ServingSnapshot& p = prev ? *prev : kEmpty;
  Writer w;
  w.i32(cur.step);
  w.u8(cur.done);
  w.u8(cur.playing);
  w.str(cur.error);

  std::vector<uint32_t> changed;
  for (size_t i = 0; i < cur.tiles.size(); ++i)
    if (i >= p.tiles.size() || !tile_equal(p.tiles[i], cur.tiles[i]))
      changed.push_back(uint32_t(i));
  w.u32(uint32_t(cur.tiles.size()));
  w.u32(uint32_t(changed.size()));
  for (uint32_t i : changed) put_tile(w, i, cur.tiles[i]);

  const bool with_attention = enc != AttnEncoding::None;
  changed.clear();
  for (size_t i = 0; i < cur.lanes.size(); ++i)
    if (i >= p.lanes.size() || !lane_equal(p.lanes[i], cur.lanes[i], with_attention))
      changed.push_back(uint32_t(i));
  w.u32(uint32_t(cur.lanes.size()));
  w.u32(uint32_t(changed.size()));
  for (uint32_t i : changed)
    put_lane(w, i, i < p.lanes.size() ? &p.lanes[i] : nullptr, cur.lanes[i], enc);

  const bool waiting_changed = cur.waiting != p.waiting;
  w.u8(waiting_changed);
  if (waiting_changed) {
    w.u32(uint32_t(cur.waiting.size()));
    for (int id : cur.waiting) w.i32(id);
  }

  w.u32(uint32_t(cur.events.size()));
  for (const SchedEvent& e : cur.events) {
    w.u8(uint8_t(e.kind));
    w.i32(e.seq);
    w.i32(e.n);
    w.str(e.detail);
  }

  size_t keep = 0;
  while (keep < std::min(p.history.size(), cur.history.size()) &&
         point_equal(p.history[keep], cur.history[keep]))
    ++keep;
  w.u32(uint32_t(keep));
  w.u32(uint32_t(cur.history.size() - keep));
  for (size_t i = keep; i < cur.history.size(); ++i) put_point(w, cur.history[i]);

  const bool totals_changed = !totals_equal(p.totals, cur.totals);
  w.u8(totals_changed);
  if (totals_changed) put_totals(w, cur.totals);
  return std::move(w.bytes());
}

Status apply_serving_step(const ServingMeta& m, const uint8_t* p, size_t n, ServingSnapshot* s) {
  Reader r(p, n);
  const int32_t step = r.i32("step", 0, kIntMax);
  if (r.ok() && step <= s->step)
    r.fail("step", "value " + std::to_string(step) + " does not follow the previous step " +
                       std::to_string(s->step) + " (steps must increase)");
  s->step = step;
  s->done = r.flag("done");
  s->playing = r.flag("playing");
  s->error = r.str("error", false);
  get_changed(r, "tiles", kServingFileMaxBlocks, kMinTileBytes, s->tiles, [&](PoolTile& t) {
    // The entry's own fields replace the tile's whole.
    t = PoolTile{};
    get_tile(r, m, t);
  });
  get_changed(r, "lanes", kServingFileMaxLanes, kMinLaneBytes, s->lanes,
              [&](Lane& l) { get_lane(r, m, l); });
  if (r.flag("waiting.changed")) {
    const uint32_t count = r.u32("waiting.count", 0, kServingFileMaxLanes);
    if (r.fits("waiting", count, 4)) {
      s->waiting.resize(count);
      for (int& id : s->waiting) id = r.i32("waiting", 0, kIntMax);
    }
  }
  const uint32_t n_events = r.u32("events.count", 0, kIntMax);
  if (r.fits("events", n_events, kMinEventBytes)) {
    s->events.assign(n_events, SchedEvent{});
    for (SchedEvent& e : s->events) {
      e.kind = EventKind(r.u8("event.kind", 0, int(EventKind::Rollback)));
      e.seq = r.i32("event.seq", kIntMin, kIntMax);
      e.n = r.i32("event.n", kIntMin, kIntMax);
      e.detail = r.str("event.detail", false);
      if (!r.ok()) break;
    }
  }
  get_appended(r, "history.keep", "history.count", kPointBytes, s->history,
               [&] { return get_point(r); });
  if (r.flag("totals.changed")) get_totals(r, s->totals);
  return r.finish();
}

}  // namespace kvscope::app
