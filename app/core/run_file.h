// run_file.h — the kvscope run file (.kvs): a whole run (prompt, settings, model identity
// and every step's trace) in a versioned, checksummed record format (docs/run_file.md).
//
// Layout: a 16-byte header ("KVSRUN\r\n", u32 version, u32 flags = 0), then records, each
// u32 tag, u64 payload length, payload, u32 CRC-32 of the payload:
//   META once, first;  STEP for steps 1..n in order;  END once, last (nothing after it).
// A file without END is truncated (a crash, a full disk, a copy cut short) and is refused.
//
// The app's history is the same format: while a run plays, the controller appends each step
// to a spool — a run file in an unlinked temporary file, without END — and the timeline
// reads old steps back by offset, so attention for thousands of steps lives on disk, not in
// memory. File > Save copies the spool and appends END. Replay reads a saved file the same
// way.
//
// Threads: one thread writes (create/append/finish/save_copy); any thread may read_step at
// an offset that append_step has returned (pread; the bytes never change once written).
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "app/core/run_codec.h"

namespace kvscope::app {

// Version 2 added the sampler's penalties (META) and the candidates' logits before them
// (STEP) at the end of their records; version 1 files are still read (no penalties).
// kRunFileVersion is the newest single-sequence version (what RunFile writes).
inline constexpr uint32_t kRunFileVersion = 2;
inline constexpr uint32_t kRunFileOldestVersion = 1;
inline constexpr uint64_t kNoOffset = ~uint64_t(0);

// Version 3 added serving runs (many sequences, app/core/serving_record.h): a version-3 file
// holds one serving run in records of its own (SRVM, SRVS, SRVE). A single-sequence run's
// records did not change, so RunFile still writes version 2 and older kvscopes still read it.
// Each reader recognises the other kind of run by its first record and says how to open it.
inline constexpr uint32_t kServingRunFileVersion = 3;

// The file header and record framing, shared by both kinds of run.
inline constexpr char kRunFileMagic[8] = {'K', 'V', 'S', 'R', 'U', 'N', '\r', '\n'};
inline constexpr uint64_t kRunFileHeaderBytes = 16;    // magic, u32 version, u32 flags
inline constexpr uint64_t kRunRecordHeaderBytes = 12;  // u32 tag, u64 length
inline constexpr uint64_t kRunRecordTrailerBytes = 4;  // u32 crc of the payload
// A record tag: four ASCII characters, the first in the low byte.
constexpr uint32_t run_record_tag(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
inline constexpr uint32_t kTagRunMeta = run_record_tag("META");
inline constexpr uint32_t kTagServingMeta = run_record_tag("SRVM");
// The tag as printable text ('?' for other bytes), for errors.
std::string run_record_tag_name(uint32_t tag);

// Bytes to validate: a file (pread) or a buffer (fuzzing, tests).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Exactly n bytes at `offset` (the caller has checked offset + n <= size()).
  virtual Status read(uint64_t offset, void* dst, size_t n) const = 0;
};

class BufferSource final : public ByteSource {
 public:
  BufferSource(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint64_t size() const override { return n_; }
  Status read(uint64_t offset, void* dst, size_t n) const override;

 private:
  const uint8_t* p_;
  size_t n_;
};

// An open file's first `size` bytes, read with pread; the descriptor is closed with the
// source when `owned`.
class FdSource final : public ByteSource {
 public:
  FdSource(int fd, uint64_t size, bool owned = false) : fd_(fd), size_(size), owned_(owned) {}
  ~FdSource() override;
  FdSource(const FdSource&) = delete;
  FdSource& operator=(const FdSource&) = delete;
  uint64_t size() const override { return size_; }
  Status read(uint64_t offset, void* dst, size_t n) const override;

 private:
  int fd_;
  uint64_t size_;
  bool owned_;
};

// One record as framed in both kinds of run file: u32 tag, u64 payload length, the
// payload, u32 CRC-32 of the payload.
struct RunRecord {
  uint32_t tag = 0;
  uint64_t offset = 0;  // of the record header
  std::vector<uint8_t> payload;
  uint64_t next = 0;  // offset just after the record
};
// Reads and checks the framing of the record at `offset` in a file whose records carry one
// of `tags`: a record cut short, a length past the end, an unknown tag or (with verify_crc)
// a checksum mismatch is an Error that begins with `file` (e.g. "run file 'a.kvs'") and
// the record's byte offset.
Expected<RunRecord> read_run_record(const ByteSource& src, uint64_t offset,
                                    const std::string& file, std::initializer_list<uint32_t> tags,
                                    bool verify_crc);

struct RunIndex {
  RunMeta meta;
  RunEnd end;
  std::vector<uint64_t> steps;  // byte offset of the STEP record of step i + 1
};

// Walks and validates a whole run file: header, framing, checksums (unless verify_crc is
// false: the fuzz target uses that to reach the payload decoders), every payload, step
// order, END. `name` goes into the error, which also gives the byte offset.
Expected<RunIndex> index_run(const ByteSource& src, const std::string& name,
                             bool verify_crc = true);
// Decodes the STEP record at `offset` (from an index).
Expected<StepTrace> read_step_record(const ByteSource& src, uint64_t offset,
                                     const std::string& name, bool verify_crc = true);

class RunFile {
 public:
  // A new run file at `path` (replacing any), META written. `attention_cap` > 0 stores
  // steps without attention once the file would grow past that many bytes.
  static Expected<std::shared_ptr<RunFile>> create(const std::string& path, const RunMeta& meta,
                                                   uint64_t attention_cap = 0);
  // An unlinked temporary run file in `dir` (created if missing): the app's history spool.
  static Expected<std::shared_ptr<RunFile>> create_spool(const std::string& dir,
                                                         const RunMeta& meta,
                                                         uint64_t attention_cap);
  // Opens and validates a finished run file (index_run over the whole file).
  static Expected<std::shared_ptr<RunFile>> open(const std::string& path);
  ~RunFile();
  RunFile(const RunFile&) = delete;
  RunFile& operator=(const RunFile&) = delete;

  // Writing (one thread). Returns the STEP record's offset.
  Expected<uint64_t> append_step(const StepTrace& t);
  Status finish(const RunEnd& end);
  // Copies what has been appended plus an END record into a new file at `path` (written
  // beside it, then renamed into place).
  Status save_copy(const std::string& path, const RunEnd& end) const;

  // Reading (any thread).
  Expected<StepTrace> read_step(uint64_t offset) const;
  const RunMeta& meta() const { return meta_; }
  const std::string& name() const { return name_; }
  uint64_t bytes() const { return size_.load(); }
  // open(): the whole index and END. While writing: offsets appended so far (writer only).
  const std::vector<uint64_t>& step_offsets() const { return steps_; }
  const RunEnd& end() const { return end_; }
  // Some step was stored without its attention rows (the cap was reached).
  bool attention_dropped() const { return dropped_.load(); }
  uint64_t attention_cap() const { return cap_; }

 private:
  RunFile() = default;
  static Expected<std::shared_ptr<RunFile>> begin(int fd, std::string name, const RunMeta& meta,
                                                  uint64_t attention_cap);
  Status write_record(uint32_t tag, const std::vector<uint8_t>& payload);
  int fd_ = -1;
  std::string name_;
  RunMeta meta_;
  RunEnd end_;
  std::vector<uint64_t> steps_;
  std::atomic<uint64_t> size_{0};
  std::atomic<bool> dropped_{false};
  uint64_t cap_ = 0;
  bool finished_ = false;
};

}  // namespace kvscope::app
