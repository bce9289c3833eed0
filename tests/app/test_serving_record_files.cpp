// test_serving_record_files.cpp — bad serving run files (truncated, a flipped byte, records
// in the wrong order, a huge count behind a good checksum) are refused with one clear error
// naming the file and the byte offset, without crashing or allocating for the count; a
// single-sequence file and a serving file each name the other, and version 1 and 2
// single-sequence files still open.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "app/core/replay_source.h"
#include "app/core/run_file.h"
#include "app/core/serving_record.h"
#include "tests/app/serving_snapshots.h"

using namespace kvscope;
using namespace kvscope::app;
using namespace kvscope::app::test;

namespace {

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

TEST(ServingRecord, TruncatedFilesAreRejected) {
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::vector<uint8_t> bytes =
      read_bytes(record_serving("trunc.kvs", snaps, AttnEncoding::F16));
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
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::vector<uint8_t> bytes =
      read_bytes(record_serving("flip.kvs", snaps, AttnEncoding::F16));
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
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::vector<uint8_t> bytes =
      read_bytes(record_serving("order2.kvs", snaps, AttnEncoding::F16));
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
    std::vector<uint8_t> b = read_bytes(record_serving("one.kvs", {snaps[0]}, AttnEncoding::F16));
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
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::vector<uint8_t> bytes =
      read_bytes(record_serving("huge.kvs", snaps, AttnEncoding::F16));
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
  meta->n_blocks = int(kServingFileMaxBlocks) + 1;
  const std::vector<uint8_t> enc = encode_serving_meta(meta.value());
  ASSERT_EQ(enc.size(), m.len);
  std::memcpy(b.data() + m.offset + kRunRecordHeaderBytes, enc.data(), enc.size());
  fix_crc(b, m);
  expect_rejected(write_bytes("huge.kvs", b), "field 'n_blocks'");
}

// Each kind of run file names the other; version 1 and 2 single-sequence files still open.
TEST(ServingRecord, SingleSequenceAndServingFilesNameEachOther) {
  const std::vector<ServingSnapshot> snaps = make_serving_run();
  const std::string serving = record_serving("kinds.kvs", snaps, AttnEncoding::F16);
  EXPECT_EQ(read_bytes(serving)[8], kServingRunFileVersion);
  auto f = RunFile::open(serving);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("a serving run: open it with --view serving --replay"),
            std::string::npos)
      << f.error().message;
  auto replay = open_replay(serving);  // what `kvscope --replay` opens
  ASSERT_FALSE(replay.ok());
  EXPECT_NE(replay.error().message.find("a serving run"), std::string::npos)
      << replay.error().message;

  // Version 1 (committed) and version 2 (written now).
  // Appended, not "dir" + "...": GCC 12 warns of a false -Warray-bounds on that sum.
  std::string v1 = KVSCOPE_SOURCE_DIR;
  v1 += "/tests/golden/run_v1.kvs";
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
