// serving_snapshots.cpp — hand-made serving snapshots and their field-by-field comparison
// (see serving_snapshots.h).
#include "tests/app/serving_snapshots.h"

#include <algorithm>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

namespace kvscope::app::test {
namespace {

void expect_floats(const std::vector<float>& a, const std::vector<float>& b, float tol,
                   const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (tol == 0)
      EXPECT_EQ(a[i], b[i]) << what << "[" << i << "]";
    else
      EXPECT_NEAR(a[i], b[i], tol) << what << "[" << i << "]";
  }
}

void expect_tile_eq(const PoolTile& a, const PoolTile& b, size_t i) {
  SCOPED_TRACE("tile " + std::to_string(i));
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.refs, b.refs);
  EXPECT_EQ(a.owners, b.owners);
  EXPECT_EQ(a.logical, b.logical);
  EXPECT_EQ(a.first_pos, b.first_pos);
  EXPECT_EQ(a.n_pos, b.n_pos);
  EXPECT_EQ(a.hash_hits, b.hash_hits);
  EXPECT_EQ(a.published, b.published);
  EXPECT_EQ(a.flash, b.flash);
}

// `tol` < 0: attention is not stored (the replay has none).
void expect_lane_eq(const Lane& a, const Lane& b, size_t i, float tol) {
  SCOPED_TRACE("lane " + std::to_string(i));
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.sample, b.sample);
  EXPECT_EQ(a.parent, b.parent);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.color, b.color);
  EXPECT_EQ(a.prompt_tokens, b.prompt_tokens);
  EXPECT_EQ(a.cached_tokens, b.cached_tokens);
  EXPECT_EQ(a.computed, b.computed);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.pieces, b.pieces);
  EXPECT_EQ(a.table, b.table);
  EXPECT_EQ(a.step_tokens, b.step_tokens);
  EXPECT_EQ(a.step_prompt, b.step_prompt);
  EXPECT_EQ(a.arrival_step, b.arrival_step);
  EXPECT_EQ(a.preemptions, b.preemptions);
  if (tol < 0)
    EXPECT_TRUE(b.attention.empty());
  else
    expect_floats(a.attention, b.attention, tol, "attention");
  EXPECT_EQ(a.ttft_ms, b.ttft_ms);
  EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.drafted, b.drafted);
  EXPECT_EQ(a.accepted, b.accepted);
}

void expect_point_eq(const ServingPoint& a, const ServingPoint& b, size_t i) {
  SCOPED_TRACE("history " + std::to_string(i));
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.running, b.running);
  EXPECT_EQ(a.waiting, b.waiting);
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.used, b.used);
  EXPECT_EQ(a.free, b.free);
  EXPECT_EQ(a.cached, b.cached);
  EXPECT_EQ(a.slot_utilization, b.slot_utilization);
  EXPECT_EQ(a.contiguous_utilization, b.contiguous_utilization);
  EXPECT_EQ(a.fragmentation, b.fragmentation);
  EXPECT_EQ(a.prefix_hit_rate, b.prefix_hit_rate);
  EXPECT_EQ(a.prefill_tokens, b.prefill_tokens);
  EXPECT_EQ(a.decode_tokens, b.decode_tokens);
  EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  EXPECT_EQ(a.ms, b.ms);
  EXPECT_EQ(a.drafted, b.drafted);
  EXPECT_EQ(a.accepted, b.accepted);
}

void expect_totals_eq(const SchedulerStats& a, const SchedulerStats& b) {
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.peak_kv_bytes, b.peak_kv_bytes);
  EXPECT_EQ(a.unshared_kv_bytes, b.unshared_kv_bytes);
  EXPECT_EQ(a.contiguous_kv_bytes, b.contiguous_kv_bytes);
  EXPECT_EQ(a.slot_utilization, b.slot_utilization);
  EXPECT_EQ(a.contiguous_utilization, b.contiguous_utilization);
  EXPECT_EQ(a.internal_fragmentation, b.internal_fragmentation);
  EXPECT_EQ(a.prefix_hit_tokens, b.prefix_hit_tokens);
  EXPECT_EQ(a.prefill_tokens, b.prefill_tokens);
  EXPECT_EQ(a.decode_tokens, b.decode_tokens);
  EXPECT_EQ(a.preemptions, b.preemptions);
  EXPECT_EQ(a.cow_copies, b.cow_copies);
  EXPECT_EQ(a.ms, b.ms);
  EXPECT_EQ(a.ttft_hit_ms, b.ttft_hit_ms);
  EXPECT_EQ(a.ttft_miss_ms, b.ttft_miss_ms);
  EXPECT_EQ(a.ttft_hits, b.ttft_hits);
  EXPECT_EQ(a.ttft_misses, b.ttft_misses);
}

// ---- a hand-made serving run -------------------------------------------------------------

// Builds snapshots step by step: each next() starts from the previous one with the flashes
// and events cleared and the step, a history point and the totals advanced.
class RunBuilder {
 public:
  RunBuilder(int n_blocks, int block_size) {
    s_.run = 7;
    s_.block_size = block_size;
    s_.n_blocks = n_blocks;
    s_.max_batch_tokens = 64;
    s_.max_seqs = 4;
    s_.context = 256;
    s_.prefix_caching = true;
    s_.n_requests = 3;
    s_.tiles.resize(size_t(n_blocks));
    snaps_.push_back(s_);
  }
  ServingSnapshot& next(int step_gap = 1) {
    s_.step += step_gap;
    s_.events.clear();
    for (PoolTile& t : s_.tiles) t.flash = TileFlash::None;
    for (Lane& l : s_.lanes) {
      l.step_tokens = 0;
      l.step_prompt = false;
      l.attention.clear();
    }
    ServingPoint p;
    p.step = s_.step;
    p.used = int(s_.step % 5);
    p.free = s_.n_blocks - p.used;
    p.slot_utilization = 0.5 + 0.01 * s_.step;
    p.contiguous_utilization = 0.125;
    p.fragmentation = 1.0 / (3 + s_.step);
    p.prefix_hit_rate = 0.25;
    p.decode_tokens = s_.step % 3;
    p.tokens_per_s = 1000.0 / (1 + s_.step);
    p.ms = 0.75 * s_.step;
    s_.history.push_back(p);
    s_.totals.steps = s_.step;
    s_.totals.ms += p.ms;
    s_.totals.decode_tokens += uint64_t(p.decode_tokens);
    s_.totals.slot_utilization = p.slot_utilization;
    s_.playing = true;
    return s_;
  }
  void commit() { snaps_.push_back(s_); }
  ServingSnapshot& cur() { return s_; }
  const std::vector<ServingSnapshot>& snapshots() const { return snaps_; }

 private:
  ServingSnapshot s_;
  std::vector<ServingSnapshot> snaps_;
};

}  // namespace

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/kvscope_serving_" + std::to_string(::getpid()) + "_" + name;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::string write_bytes(const std::string& name, const std::vector<uint8_t>& b) {
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  return path;
}

// ---- field-by-field equality -------------------------------------------------------------

void expect_snapshot_eq(const ServingSnapshot& a, const ServingSnapshot& b, float tol) {
  SCOPED_TRACE("step " + std::to_string(a.step));
  EXPECT_EQ(a.run, b.run);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.done, b.done);
  EXPECT_EQ(a.playing, b.playing);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.n_blocks, b.n_blocks);
  EXPECT_EQ(a.max_batch_tokens, b.max_batch_tokens);
  EXPECT_EQ(a.max_seqs, b.max_seqs);
  EXPECT_EQ(a.context, b.context);
  EXPECT_EQ(a.prefix_caching, b.prefix_caching);
  EXPECT_EQ(a.n_requests, b.n_requests);
  ASSERT_EQ(a.tiles.size(), b.tiles.size());
  for (size_t i = 0; i < a.tiles.size(); ++i) expect_tile_eq(a.tiles[i], b.tiles[i], i);
  ASSERT_EQ(a.lanes.size(), b.lanes.size());
  for (size_t i = 0; i < a.lanes.size(); ++i) expect_lane_eq(a.lanes[i], b.lanes[i], i, tol);
  EXPECT_EQ(a.waiting, b.waiting);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].kind, b.events[i].kind) << "event " << i;
    EXPECT_EQ(a.events[i].seq, b.events[i].seq) << "event " << i;
    EXPECT_EQ(a.events[i].n, b.events[i].n) << "event " << i;
    EXPECT_EQ(a.events[i].detail, b.events[i].detail) << "event " << i;
  }
  ASSERT_EQ(a.history.size(), b.history.size());
  for (size_t i = 0; i < a.history.size(); ++i) expect_point_eq(a.history[i], b.history[i], i);
  expect_totals_eq(a.totals, b.totals);
}

Lane new_lane(int seq, int request, int arrival) {
  Lane l;
  l.seq = seq;
  l.request = request;
  l.color = request * 3 + 1;
  l.prompt_tokens = 6;
  l.arrival_step = arrival;
  l.ids = {1, 15, 27, 99, 4, 8};
  l.pieces = {"<s>", "The", " tin", " can", " é", "\xe2\x82"};  // a split character too
  return l;
}

void use_tile(ServingSnapshot& s, int block, int seq, int logical, int n_pos, TileFlash f) {
  PoolTile& t = s.tiles[size_t(block)];
  t.state = TileState::Used;
  t.refs = 1;
  t.owners = {seq};
  t.logical = logical;
  t.first_pos = logical * s.block_size;
  t.n_pos = n_pos;
  t.flash = f;
}

std::vector<float> attention_over(int n, int salt) {
  std::vector<float> a(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) a[size_t(i)] = float((i * 7 + salt) % 11) / 11.0f;
  return a;
}

// Every field and event kind, over more steps than a checkpoint interval.
std::vector<ServingSnapshot> make_serving_run() {
  RunBuilder b(12, 4);
  {  // 1: two requests arrive
    ServingSnapshot& s = b.next();
    s.lanes = {new_lane(0, 0, 1), new_lane(1, 1, 1)};
    s.waiting = {0, 1};
    s.events = {{EventKind::Arrive, 0, 0, ""}, {EventKind::Arrive, 1, 0, ""}};
    b.commit();
  }
  {  // 2: 0 admitted, its prompt in one chunk
    ServingSnapshot& s = b.next();
    Lane& l = s.lanes[0];
    l.state = LaneState::Running;
    l.computed = 6;
    l.step_tokens = 6;
    l.step_prompt = true;
    l.table = {0, 1};
    l.attention = attention_over(6, 1);
    use_tile(s, 0, 0, 0, 4, TileFlash::Written);
    use_tile(s, 1, 0, 1, 2, TileFlash::Written);
    s.tiles[0].published = true;
    s.waiting = {1};
    s.events = {{EventKind::Admit, 0, 0, ""}, {EventKind::Chunk, 0, 6, ""}};
    s.totals.prefill_tokens = 6;
    b.commit();
  }
  {  // 3: 1 admitted on a prefix hit and forked; 0 decodes (a rollback); a copy-on-write
    ServingSnapshot& s = b.next();
    Lane& a = s.lanes[0];
    a.ids.push_back(42);
    a.pieces.push_back(" lid");
    a.computed = 7;
    a.step_tokens = 1;
    a.attention = attention_over(7, 2);
    a.ttft_ms = 12.5;
    a.tokens_per_s = 80;
    s.tiles[1].n_pos = 3;
    s.tiles[1].flash = TileFlash::Written;
    Lane& c = s.lanes[1];
    c.state = LaneState::Running;
    c.cached_tokens = 4;
    c.computed = 6;
    c.table = {0, 2};
    c.step_tokens = 2;
    c.step_prompt = true;
    c.attention = attention_over(6, 3);
    s.tiles[0].refs = 2;
    s.tiles[0].owners = {0, 1};
    s.tiles[0].hash_hits = 1;
    s.tiles[0].flash = TileFlash::PrefixHit;
    use_tile(s, 2, 1, 1, 2, TileFlash::Cow);
    Lane f = new_lane(2, 1, 1);
    f.sample = 1;
    f.parent = 1;
    f.state = LaneState::Running;
    f.table = {0};
    s.lanes.push_back(f);
    s.tiles[0].refs = 3;
    s.tiles[0].owners = {0, 1, 2};
    s.waiting.clear();
    s.events = {{EventKind::Admit, 1, 0, ""},
                {EventKind::PrefixHit, 1, 4, ""},
                {EventKind::Chunk, 1, 2, ""},
                {EventKind::Fork, 2, 1, ""},
                {EventKind::Cow, 2, 1, ""},
                {EventKind::Rollback, 0, 3, ""}};
    s.totals.prefix_hit_tokens = 4;
    s.totals.cow_copies = 1;
    b.commit();
  }
  {  // 4: 1 preempted (computed back to 0, its table cleared, its blocks released)
    ServingSnapshot& s = b.next();
    Lane& c = s.lanes[1];
    c.state = LaneState::Preempted;
    c.computed = 0;
    c.table.clear();
    c.preemptions = 1;
    s.tiles[2] = PoolTile{};
    s.tiles[2].flash = TileFlash::Released;
    s.tiles[0].refs = 2;
    s.tiles[0].owners = {0, 2};
    s.waiting = {1};
    s.events = {{EventKind::Preempt, 1, 6, ""}};
    s.totals.preemptions = 1;
    b.commit();
  }
  {  // 6 (a step not recorded in between): 0 finishes, 2 cancelled, 1 fails, a cache eviction
    ServingSnapshot& s = b.next(2);
    s.lanes[0].state = LaneState::Finished;
    s.lanes[0].stop = "eos";
    s.lanes[2].state = LaneState::Cancelled;
    s.lanes[2].stop = "cancelled";
    s.lanes[1].state = LaneState::Failed;
    s.lanes[1].stop = "error";
    s.lanes[0].pieces[2] = " TIN";  // a piece re-rendered: the list is rewritten from there
    s.waiting.clear();
    s.tiles[0].state = TileState::Cached;
    s.tiles[0].refs = 0;
    s.tiles[0].owners.clear();
    s.tiles[1] = PoolTile{};
    s.tiles[1].flash = TileFlash::Released;
    s.tiles[3].flash = TileFlash::Evicted;
    s.events = {{EventKind::Finish, 0, 0, "eos"},
                {EventKind::Cancel, 2, 0, ""},
                {EventKind::Fail, 1, 0, "request 1 needs 9 blocks; the pool has 8"}};
    s.totals.finished = 1;
    s.history[2].ms = 99;  // an old point rewritten: history kept up to it
    b.commit();
  }
  // 7..: a third request decodes for longer than a checkpoint interval.
  {
    ServingSnapshot& s = b.next();
    s.lanes.push_back(new_lane(3, 2, 7));
    s.lanes[3].state = LaneState::Running;
    s.events = {{EventKind::Arrive, 3, 0, ""}, {EventKind::Admit, 3, 0, ""}};
    b.commit();
  }
  for (int k = 0; k < 150; ++k) {
    ServingSnapshot& s = b.next();
    Lane& l = s.lanes[3];
    l.ids.push_back(100 + k);
    l.pieces.push_back(" w" + std::to_string(k));
    l.computed = int(l.ids.size());
    l.step_tokens = 1;
    l.attention = attention_over(l.computed, k);
    l.tokens_per_s = 50 + k;
    // Speculative decoding every third step: 3 drafted, k % 4 of them kept (at most 3).
    l.drafted.clear();
    l.accepted = 0;
    if (k % 3 == 0) {
      l.drafted = {" d" + std::to_string(k), " e", " f"};
      l.accepted = std::min(k % 4, 3);
      s.history.back().drafted = 3;
      s.history.back().accepted = l.accepted;
    }
    const int block = 4 + (l.computed - 1) / 4 % 8;
    if (l.table.empty() || l.table.back() != block) l.table.push_back(block);
    use_tile(s, block, 3, int(l.table.size()) - 1, (l.computed - 1) % 4 + 1, TileFlash::Written);
    if (k % 40 == 39) s.lanes[3].table.clear();  // the window gives blocks back
    s.events = {{EventKind::Chunk, 3, 1, ""}};
    if (k == 149) {
      s.done = true;
      s.playing = false;
      s.error = "stopped: the person pressed Stop";
    }
    b.commit();
  }
  return b.snapshots();
}

ServingMeta serving_test_meta(AttnEncoding enc) {
  ServingMeta m;
  m.producer = "kvscope test";
  m.model.file_name = "tiny.gguf";
  m.model.name = "tiny";
  m.model.n_layer = 2;
  m.attention = enc;
  return m;
}

std::string record_serving(const std::string& name, const std::vector<ServingSnapshot>& snaps,
                           AttnEncoding enc) {
  const std::string path = temp_path(name);
  auto rec = ServingRecorder::create(path, serving_test_meta(enc), snaps[0]);
  EXPECT_TRUE(rec.ok()) << rec.error().message;
  if (!rec.ok()) return path;
  for (size_t i = 1; i < snaps.size(); ++i) {
    Status st = rec.value()->append(snaps[i]);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  Status st = rec.value()->finish();
  EXPECT_TRUE(st.ok()) << st.message();
  return path;
}
}  // namespace kvscope::app::test
