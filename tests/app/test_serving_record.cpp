// test_serving_record.cpp — a serving run recorded and replayed (app/core/serving_record.h):
// every field of every snapshot comes back (tests/app/serving_snapshots.h makes a run that
// changes them all), in any order of access; stepping forward changes only what a record
// says; the recorder refuses snapshots out of order or from another run; a 16 x 1,000-token
// run stays small.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "app/core/run_file.h"
#include "app/core/serving_record.h"
#include "tests/app/serving_snapshots.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::test;

TEST(ServingRecord, EverySnapshotComesBackFieldByField) {
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  ASSERT_GT(snaps.size(), size_t(2 * ServingReplay::kCheckpointEvery));
  const std::string path = record_serving("exact.kvs", snaps, AttnEncoding::F32);
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
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::string f16 = record_serving("f16.kvs", snaps, AttnEncoding::F16);
  const std::string none = record_serving("none.kvs", snaps, AttnEncoding::None);
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
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::string path = record_serving("forward.kvs", snaps, AttnEncoding::F16);
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
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::string path = temp_path("order.kvs");
  auto rec = ServingRecorder::create(path, serving_test_meta(AttnEncoding::F16), snaps[3]);
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
    auto rec = ServingRecorder::create(path, serving_test_meta(size.enc), cur);
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
