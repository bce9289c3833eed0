// test_serving_record.cpp — a serving run recorded and replayed (app/core/serving_record.h):
// every field of every snapshot comes back (tiles changing state, references, owners and
// flashes; lanes arriving, growing, forked, preempted, finishing, cancelled, failing; every
// event kind; the waiting queue; the history; the totals), in any order of access; bad files
// — truncated, flipped, reordered, with a huge count behind a good checksum — are refused
// with one clear error; single-sequence files and serving files each name the other.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "app/core/run_file.h"
#include "app/core/serving_record.h"

using namespace kvscope;
using namespace kvscope::app;

namespace {

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
std::vector<ServingSnapshot> make_run() {
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
  {  // 3: 1 admitted on a prefix hit and forked; 0 decodes; a copy-on-write
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
                {EventKind::Cow, 2, 1, ""}};
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

ServingMeta test_meta(AttnEncoding enc) {
  ServingMeta m;
  m.producer = "kvscope test";
  m.model.file_name = "tiny.gguf";
  m.model.name = "tiny";
  m.model.n_layer = 2;
  m.attention = enc;
  return m;
}

std::string record(const std::string& name, const std::vector<ServingSnapshot>& snaps,
                   AttnEncoding enc) {
  const std::string path = temp_path(name);
  auto rec = ServingRecorder::create(path, test_meta(enc), snaps[0]);
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

void expect_rejected(const std::string& path, const std::string& words) {
  auto r = ServingReplay::open(path);
  ASSERT_FALSE(r.ok()) << "accepted a bad file; expected: " << words;
  EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find(words), std::string::npos)
      << "error: " << r.error().message << "\nexpected to contain: " << words;
}

// The records of a file: offset, tag, payload length.
struct RecordAt {
  uint64_t offset;
  uint32_t tag;
  uint64_t len;
};
std::vector<RecordAt> records_of(const std::vector<uint8_t>& b) {
  std::vector<RecordAt> out;
  for (uint64_t at = kRunFileHeaderBytes; at + kRunRecordHeaderBytes <= b.size();) {
    RecordAt r{at, 0, 0};
    std::memcpy(&r.tag, b.data() + at, 4);
    std::memcpy(&r.len, b.data() + at + 4, 8);
    out.push_back(r);
    at += kRunRecordHeaderBytes + r.len + kRunRecordTrailerBytes;
  }
  return out;
}
void fix_crc(std::vector<uint8_t>& b, const RecordAt& r) {
  const uint8_t* payload = b.data() + r.offset + kRunRecordHeaderBytes;
  const uint32_t crc = crc32(payload, size_t(r.len));
  std::memcpy(b.data() + r.offset + kRunRecordHeaderBytes + r.len, &crc, 4);
}

}  // namespace

TEST(ServingRecord, EverySnapshotComesBackFieldByField) {
  const std::vector<ServingSnapshot> snaps = make_run();
  ASSERT_GT(snaps.size(), size_t(2 * ServingReplay::kCheckpointEvery));
  const std::string path = record("exact.kvs", snaps, AttnEncoding::F32);
  auto rp = ServingReplay::open(path);
  ASSERT_TRUE(rp.ok()) << rp.error().message;
  ServingReplay& r = *rp.value();
  EXPECT_EQ(r.meta().model.file_name, "tiny.gguf");
  EXPECT_EQ(r.meta().n_blocks, 12);
  EXPECT_EQ(r.meta().attention, AttnEncoding::F32);
  ASSERT_EQ(r.steps(), int(snaps.size()));
  // Forward, one at a time.
  for (int i = 0; i < r.steps(); ++i) {
    auto s = r.snapshot(i);
    ASSERT_TRUE(s.ok()) << s.error().message;
    expect_snapshot_eq(snaps[size_t(i)], *s.value(), 0);
    if (::testing::Test::HasFailure()) return;
  }
  // Backward, and jumps.
  for (int i : {r.steps() - 1, 100, 3, 64, 65, 0, 130, 129, 5, 150, 2}) {
    auto s = r.snapshot(i);
    ASSERT_TRUE(s.ok()) << s.error().message;
    expect_snapshot_eq(snaps[size_t(i)], *s.value(), 0);
  }
  EXPECT_FALSE(r.snapshot(-1).ok());
  EXPECT_FALSE(r.snapshot(r.steps()).ok());
}

TEST(ServingRecord, AttentionInF16IsRoundedAndNoneDropsIt) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::string f16 = record("f16.kvs", snaps, AttnEncoding::F16);
  const std::string none = record("none.kvs", snaps, AttnEncoding::None);
  auto a = ServingReplay::open(f16);
  auto b = ServingReplay::open(none);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  for (int i = 0; i < int(snaps.size()); ++i) {
    expect_snapshot_eq(snaps[size_t(i)], *a.value()->snapshot(i).value(), 1e-3f);
    expect_snapshot_eq(snaps[size_t(i)], *b.value()->snapshot(i).value(), -1);
  }
  EXPECT_LT(std::filesystem::file_size(none), std::filesystem::file_size(f16));
}

// Forward one step at a time reuses the snapshot the caller let go of (no copy of the whole
// run); one the caller still holds is never changed under it.
TEST(ServingRecord, SteppingForwardChangesOnlyWhatTheRecordSays) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::string path = record("forward.kvs", snaps, AttnEncoding::F16);
  auto rp = ServingReplay::open(path);
  ASSERT_TRUE(rp.ok()) << rp.error().message;
  ServingReplay& r = *rp.value();
  const ServingSnapshot* last = nullptr;
  for (int i = 10; i < 60; ++i) {
    auto s = r.snapshot(i);
    ASSERT_TRUE(s.ok());
    if (last) {
      EXPECT_EQ(s.value().get(), last) << "step " << i << " was copied";
    }
    last = s.value().get();
  }
  auto held = r.snapshot(70).value();
  const ServingSnapshot copy = *held;
  auto next = r.snapshot(71).value();
  EXPECT_NE(next.get(), held.get());
  expect_snapshot_eq(copy, *held, 0);
  expect_snapshot_eq(snaps[71], *next, 1e-3f);
}

TEST(ServingRecord, TheRecorderRefusesStepsOutOfOrderAndAnotherRun) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::string path = temp_path("order.kvs");
  auto rec = ServingRecorder::create(path, test_meta(AttnEncoding::F16), snaps[3]);
  ASSERT_TRUE(rec.ok()) << rec.error().message;
  Status st = rec.value()->append(snaps[2]);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("does not follow"), std::string::npos) << st.message();
  ServingSnapshot other = snaps[4];
  other.run = 8;
  st = rec.value()->append(other);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("another run"), std::string::npos) << st.message();
  // Refused for order or run: nothing changed, the next good snapshot is recorded.
  ASSERT_TRUE(rec.value()->append(snaps[4]).ok());
  // A value the format refuses ends the recording; the file keeps the steps before it.
  ServingSnapshot bad = snaps[5];
  bad.lanes[0].table = {99};  // past the pool
  st = rec.value()->append(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lane.table"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("recording stopped at step"), std::string::npos) << st.message();
  EXPECT_FALSE(rec.value()->append(snaps[6]).ok());
  ASSERT_TRUE(rec.value()->finish().ok());
  EXPECT_FALSE(rec.value()->append(snaps[6]).ok());
  auto rp = ServingReplay::open(path);
  ASSERT_TRUE(rp.ok()) << rp.error().message;
  ASSERT_EQ(rp.value()->steps(), 2);
  expect_snapshot_eq(snaps[3], *rp.value()->snapshot(0).value(), 1e-3f);
  expect_snapshot_eq(snaps[4], *rp.value()->snapshot(1).value(), 1e-3f);
}

TEST(ServingRecord, TruncatedFilesAreRejected) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::vector<uint8_t> bytes = read_bytes(record("trunc.kvs", snaps, AttnEncoding::F16));
  ASSERT_GT(bytes.size(), 1000u);
  const std::vector<RecordAt> recs = records_of(bytes);
  // At every record boundary, and inside the header and records.
  std::vector<size_t> cuts = {0,
                              5,
                              15,
                              16,
                              17,
                              size_t(recs[1].offset) + 7,
                              size_t(recs[1].offset) + 30,
                              bytes.size() - 1,
                              bytes.size() - 10};
  for (const RecordAt& r : recs) cuts.push_back(size_t(r.offset));
  for (size_t cut : cuts) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    const std::string path =
        write_bytes("cut.kvs", std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(cut)));
    auto r = ServingReplay::open(path);
    ASSERT_FALSE(r.ok());
    const std::string& m = r.error().message;
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_TRUE(m.find("truncated") != std::string::npos ||
                m.find("not a kvscope run file") != std::string::npos ||
                m.find("runs past the end") != std::string::npos)
        << m;
  }
  expect_rejected(write_bytes("cut.kvs", std::vector<uint8_t>(bytes.begin(), bytes.end() - 8)),
                  "runs past the end");
  expect_rejected(
      write_bytes("cut.kvs",
                  std::vector<uint8_t>(bytes.begin(), bytes.begin() + long(recs.back().offset))),
      "without its SRVE record");
}

TEST(ServingRecord, AFlippedByteIsCaughtWithItsOffset) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::vector<uint8_t> bytes = read_bytes(record("flip.kvs", snaps, AttnEncoding::F16));
  const std::vector<RecordAt> recs = records_of(bytes);
  for (size_t k : {size_t(0), size_t(3), recs.size() - 2}) {
    const RecordAt& r = recs[k];
    std::vector<uint8_t> b = bytes;
    b[size_t(r.offset + kRunRecordHeaderBytes + r.len / 2)] ^= 0x10;
    const std::string path = write_bytes("flip.kvs", b);
    expect_rejected(path, "checksum mismatch");
    expect_rejected(path, "record at byte " + std::to_string(r.offset));
  }
  std::vector<uint8_t> b = bytes;
  b[8] = 9;
  expect_rejected(write_bytes("flip.kvs", b), "format version 9 is not a serving run");
  b = bytes;
  b[12] = 1;
  expect_rejected(write_bytes("flip.kvs", b), "header flags");
  b = bytes;
  b.push_back(0);
  expect_rejected(write_bytes("flip.kvs", b), "1 bytes after the SRVE record");
}

TEST(ServingRecord, RecordsInTheWrongOrderAreRejected) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::vector<uint8_t> bytes = read_bytes(record("order2.kvs", snaps, AttnEncoding::F16));
  const std::vector<RecordAt> recs = records_of(bytes);
  auto slice = [&](const RecordAt& r) {
    const auto* p = bytes.data() + r.offset;
    return std::vector<uint8_t>(p, p + kRunRecordHeaderBytes + r.len + kRunRecordTrailerBytes);
  };
  auto file_of = [&](std::initializer_list<size_t> order) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + long(kRunFileHeaderBytes));
    for (size_t k : order) {
      auto s = slice(recs[k]);
      b.insert(b.end(), s.begin(), s.end());
    }
    return write_bytes("order.kvs", b);
  };
  const size_t end = recs.size() - 1;
  expect_rejected(file_of({1, 0, 2, end}), "the first record is SRVS, expected SRVM");
  expect_rejected(file_of({0, 0, 1, end}), "a second SRVM record");
  expect_rejected(file_of({0, 1, 2, 3, 2, end}), "does not follow the previous step");
  expect_rejected(file_of({0, 1, 1, end}), "does not follow the previous step");
  expect_rejected(file_of({0, 1, 2, end}), "field 'steps'");  // END says more steps
  {  // A whole one-snapshot file with a record after its SRVE.
    std::vector<uint8_t> b = read_bytes(record("one.kvs", {snaps[0]}, AttnEncoding::F16));
    auto s = slice(recs[2]);
    b.insert(b.end(), s.begin(), s.end());
    expect_rejected(write_bytes("order.kvs", b), "bytes after the SRVE record");
  }
  // A delta applied to the wrong base: step 1's lanes did not exist before it.
  expect_rejected(file_of({0, 2}), "snapshot 0");
}

// A count far beyond the bytes behind it, with the checksum made right again, is refused
// before anything is allocated for it.
TEST(ServingRecord, AHugeCountIsRefusedBeforeAllocating) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::vector<uint8_t> bytes = read_bytes(record("huge.kvs", snaps, AttnEncoding::F16));
  const std::vector<RecordAt> recs = records_of(bytes);
  // The first SRVS payload: i32 step, u8 done, u8 playing, str error (empty), then
  // u32 tiles.size, u32 tiles.changed.
  const size_t payload = size_t(recs[1].offset + kRunRecordHeaderBytes);
  auto patched = [&](size_t at, uint32_t v, const RecordAt& r) {
    std::vector<uint8_t> b = bytes;
    std::memcpy(b.data() + at, &v, 4);
    fix_crc(b, r);
    return write_bytes("huge.kvs", b);
  };
  expect_rejected(patched(payload + 10, 0xFFFFFFF0u, recs[1]), "field 'tiles.size'");
  expect_rejected(patched(payload + 10, 4000000u, recs[1]), "grows from 0 to 4000000");
  {
    std::vector<uint8_t> b = bytes;
    const uint32_t n = 4000000u;
    std::memcpy(b.data() + payload + 10, &n, 4);
    std::memcpy(b.data() + payload + 14, &n, 4);
    fix_crc(b, recs[1]);
    expect_rejected(write_bytes("huge.kvs", b), "do not fit");
  }
  // The error string's length.
  expect_rejected(patched(payload + 6, 0x7FFFFFF0u, recs[1]), "field 'error'");
  // In SRVM: n_blocks is bounded.
  std::vector<uint8_t> b = bytes;
  const RecordAt& m = recs[0];
  auto meta = decode_serving_meta(b.data() + m.offset + kRunRecordHeaderBytes, size_t(m.len));
  ASSERT_TRUE(meta.ok());
  meta->n_blocks = int(kServingMaxBlocks) + 1;
  const std::vector<uint8_t> enc = encode_serving_meta(meta.value());
  ASSERT_EQ(enc.size(), m.len);
  std::memcpy(b.data() + m.offset + kRunRecordHeaderBytes, enc.data(), enc.size());
  fix_crc(b, m);
  expect_rejected(write_bytes("huge.kvs", b), "field 'n_blocks'");
}

// Each kind of run file names the other; version 1 and 2 single-sequence files still open.
TEST(ServingRecord, SingleSequenceAndServingFilesNameEachOther) {
  const std::vector<ServingSnapshot> snaps = make_run();
  const std::string serving = record("kinds.kvs", snaps, AttnEncoding::F16);
  EXPECT_EQ(read_bytes(serving)[8], kServingRunFileVersion);
  auto f = RunFile::open(serving);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("a serving run: open it with --view serving --replay"),
            std::string::npos)
      << f.error().message;

  // Version 1 (committed) and version 2 (written now).
  const std::string v1 = std::string(KVSCOPE_SOURCE_DIR) + "/tests/golden/run_v1.kvs";
  ASSERT_TRUE(RunFile::open(v1).ok());
  auto one = ServingReplay::open(v1);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.error().message.find("a single-sequence run: open it with --replay"),
            std::string::npos)
      << one.error().message;

  RunMeta meta = RunFile::open(v1).value()->meta();
  const std::string v2 = temp_path("v2.kvs");
  {
    auto w = RunFile::create(v2, meta);
    ASSERT_TRUE(w.ok()) << w.error().message;
    ASSERT_TRUE(w.value()->finish(RunEnd{0, "max_tokens"}).ok());
  }
  EXPECT_EQ(read_bytes(v2)[8], kRunFileVersion);
  auto two = RunFile::open(v2);
  ASSERT_TRUE(two.ok()) << two.error().message;
  EXPECT_EQ(two.value()->meta(), meta);
  expect_rejected(v2, "a single-sequence run");
}

// A 16-sequence run of 1,000 generated tokens each (a 100-token prompt, one decode step for
// every lane per step): the file stays small because a step stores what changed.
TEST(ServingRecord, ASixteenByThousandRunStaysSmall) {
  const int kLanes = 16, kPrompt = 100, kTokens = 1000, kBlock = 16;
  const int blocks_each = (kPrompt + kTokens + kBlock - 1) / kBlock;
  ServingSnapshot s;
  s.run = 1;
  s.block_size = kBlock;
  s.n_blocks = kLanes * blocks_each + 16;
  s.max_batch_tokens = 2048;
  s.max_seqs = kLanes;
  s.context = 2048;
  s.n_requests = kLanes;
  s.tiles.resize(size_t(s.n_blocks));
  for (int q = 0; q < kLanes; ++q) {
    Lane l = new_lane(q, q, 0);
    l.ids.assign(size_t(kPrompt), 5);
    l.pieces.assign(size_t(kPrompt), " tok");
    l.prompt_tokens = kPrompt;
    l.state = LaneState::Running;
    s.lanes.push_back(l);
  }
  struct Size {
    AttnEncoding enc;
    uint64_t bytes = 0;
  };
  std::vector<Size> sizes = {{AttnEncoding::None}, {AttnEncoding::F16}};
  for (Size& size : sizes) {
    ServingSnapshot cur = s;
    const std::string path = temp_path(std::string("big_") + attn_encoding_name(size.enc));
    auto rec = ServingRecorder::create(path, test_meta(size.enc), cur);
    ASSERT_TRUE(rec.ok()) << rec.error().message;
    for (int step = 1; step <= kTokens; ++step) {
      cur.step = step;
      cur.events.clear();
      for (PoolTile& t : cur.tiles) t.flash = TileFlash::None;
      for (int q = 0; q < kLanes; ++q) {
        Lane& l = cur.lanes[size_t(q)];
        const int pos = int(l.ids.size());
        l.ids.push_back(1000 + (step * 31 + q) % 5000);
        l.pieces.push_back(" w" + std::to_string(step % 97));
        l.computed = pos + 1;
        l.step_tokens = step == 1 ? kPrompt + 1 : 1;
        l.step_prompt = step == 1;
        l.tokens_per_s = 20.0 + step * 0.01;
        if (size.enc != AttnEncoding::None) l.attention = attention_over(pos + 1, step);
        const int block = q * blocks_each + pos / kBlock;
        if (l.table.empty() || l.table.back() != block) l.table.push_back(block);
        use_tile(cur, block, q, pos / kBlock, pos % kBlock + 1, TileFlash::Written);
        cur.events.push_back({EventKind::Chunk, q, 1, ""});
      }
      cur.history.push_back(ServingPoint{step, kLanes, 0, 0, step, 0, 0, 0.5, 0.1, 0.01, 0.0, 0,
                                         kLanes, 1000.0, 2.0});
      cur.totals.steps = step;
      cur.totals.decode_tokens += kLanes;
      ASSERT_TRUE(rec.value()->append(cur).ok());
    }
    ASSERT_TRUE(rec.value()->finish().ok());
    size.bytes = std::filesystem::file_size(path);
    std::printf("16 x 1,000 tokens, attention %s: %llu bytes (%.1f per lane-step)\n",
                attn_encoding_name(size.enc), static_cast<unsigned long long>(size.bytes),
                double(size.bytes) / (kLanes * kTokens));
    auto rp = ServingReplay::open(path);
    ASSERT_TRUE(rp.ok()) << rp.error().message;
    auto last = rp.value()->snapshot(kTokens);
    ASSERT_TRUE(last.ok());
    expect_snapshot_eq(cur, *last.value(), size.enc == AttnEncoding::None ? -1 : 1e-3f);
    std::filesystem::remove(path);
  }
  // Without attention: about what one step adds (ids, pieces, tiles, events, a point).
  EXPECT_LT(sizes[0].bytes, 4u << 20);
  // f16 attention dominates: 2 bytes per attended position, nothing more than ~1.2x that.
  const double attn_bytes = 2.0 * kLanes * (kTokens * (kPrompt + (kTokens + 1) / 2.0));
  EXPECT_LT(double(sizes[1].bytes), double(sizes[0].bytes) + 1.2 * attn_bytes);
}
