// serving_record.h — a serving run (many sequences from one pool of KV blocks, see
// serving_run.h) recorded into a run file and replayed from it without the model.
//
// The file is the run file's container (run_file.h: header, then records of u32 tag, u64
// length, payload, CRC-32) at format version 3, with records of its own (docs/run_file.md):
//   SRVM once, first: the producer, the model's identity, the configuration;
//   SRVS per recorded snapshot, steps strictly increasing: what changed since the previous
//        snapshot (tiles and lanes whose fields changed, only the token ids and pieces a lane
//        appended, the waiting queue when it changed, the step's events, the new history
//        points, the totals);
//   SRVE once, last: the number of SRVS records.
// A single-sequence file (META first) is refused by ServingReplay with a message saying how
// to open it; RunFile does the same for a serving file.
//
// Threads: a recorder is used by one thread; so is a replay (snapshot() caches and mutates).
// The snapshots a replay hands out are immutable and may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "app/core/run_codec.h"
#include "app/core/run_file.h"
#include "app/core/serving_run.h"

namespace kvscope::app {

inline constexpr uint32_t kTagServingStep = run_record_tag("SRVS");
inline constexpr uint32_t kTagServingEnd = run_record_tag("SRVE");

// Bounds the decoder accepts: they bound allocations from a corrupt file.
inline constexpr int64_t kServingFileMaxBlocks = 1 << 22;  // tiles of the pool
inline constexpr int64_t kServingFileMaxLanes = 1 << 20;   // sequences

// The SRVM record: who made the run and how it was configured. create() copies the
// configuration (block_size .. n_requests, run) from the first snapshot; every later
// snapshot must have the same.
struct ServingMeta {
  std::string producer;  // "kvscope 0.1.0"
  ModelFacts model;      // at least file_name; numbers 0 when unknown
  // How lanes' attention rows are stored: f32 (exact), f16 (rounded), none (dropped).
  AttnEncoding attention = AttnEncoding::F16;
  uint64_t run = 0;
  int block_size = 0;
  int n_blocks = 0;
  int max_batch_tokens = 0, max_seqs = 0, context = 0;
  bool prefix_caching = true;
  int n_requests = 0;
  bool operator==(const ServingMeta& o) const;
};

// Payloads to and from bytes (exposed for the tests and the fuzz target).
std::vector<uint8_t> encode_serving_meta(const ServingMeta& m);
Expected<ServingMeta> decode_serving_meta(const uint8_t* p, size_t n);
// The SRVS payload that turns `prev` into `cur` (`prev` null: the first snapshot, against an
// empty one). Non-finite numbers are stored as 0.
std::vector<uint8_t> encode_serving_step(const ServingSnapshot* prev, const ServingSnapshot& cur,
                                         AttnEncoding attention);
// Applies an SRVS payload to `s` (the previous snapshot, or one made by
// serving_snapshot_start for the first), checking every field and count against the payload
// and the state it changes. On error `s` is left partly changed.
Status apply_serving_step(const ServingMeta& meta, const uint8_t* p, size_t n, ServingSnapshot* s);
// The state before the first step: the configuration from `meta`, nothing else.
ServingSnapshot serving_snapshot_start(const ServingMeta& meta);

class ServingRecorder {
 public:
  // A new serving run file at `path` (replacing any), its SRVM record and `first` written.
  // `meta`'s configuration fields are taken from `first`.
  static Expected<std::unique_ptr<ServingRecorder>> create(const std::string& path,
                                                           ServingMeta meta,
                                                           const ServingSnapshot& first);
  ~ServingRecorder();
  ServingRecorder(const ServingRecorder&) = delete;
  ServingRecorder& operator=(const ServingRecorder&) = delete;

  // The next snapshot: its step must be greater than the previous one's, its run and
  // configuration the same (else an error, and nothing changes). Writes what changed. A
  // snapshot holding a value the format refuses (docs/run_file.md) ends the recording: that
  // and every later append fail; finish() still closes the file with the steps before it.
  Status append(const ServingSnapshot& s);
  // Writes SRVE and flushes; nothing may be appended after.
  Status finish();

  int steps() const { return steps_; }
  uint64_t bytes() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  ServingRecorder() = default;
  Status write_record(uint32_t tag, const std::vector<uint8_t>& payload);
  Status write_step(const ServingSnapshot& s);
  int fd_ = -1;
  std::string path_;
  ServingMeta meta_;
  // What a reader rebuilds after the records written so far (attention as stored): the
  // base of the next delta, and a check that every record decodes.
  ServingSnapshot mirror_;
  int steps_ = 0;
  uint64_t size_ = 0;
  bool finished_ = false;
  std::string failed_;  // why the recording stopped (empty: it did not)
};

class ServingReplay {
 public:
  // Opens and validates a whole serving run file: header, framing, checksums, every payload
  // applied in order, step order, SRVE. The first problem is the error: one line naming the
  // file, the record and its byte offset, the field.
  static Expected<std::unique_ptr<ServingReplay>> open(const std::string& path);
  // The same over any bytes (tests, fuzzing); `verify_crc` false reaches the decoders.
  static Expected<std::unique_ptr<ServingReplay>> open(std::unique_ptr<ByteSource> src,
                                                       const std::string& name,
                                                       bool verify_crc = true);
  ~ServingReplay();

  const ServingMeta& meta() const { return meta_; }
  const std::string& name() const { return name_; }
  int steps() const { return int(offsets_.size()); }  // recorded snapshots
  // The snapshot recorded `index`-th (0 .. steps() - 1; its `step` field is the scheduler's
  // step), rebuilt exactly. Forward one at a time is O(what changed) when the caller has let
  // go of the previous snapshot (it is then reused in place); otherwise one copy. Going back
  // starts from the nearest checkpoint (one every kCheckpointEvery snapshots).
  Expected<std::shared_ptr<const ServingSnapshot>> snapshot(int index);

  static constexpr int kCheckpointEvery = 64;

 private:
  ServingReplay() = default;
  Status apply_record(int index, ServingSnapshot* s) const;
  std::unique_ptr<ByteSource> src_;
  std::string name_;
  bool verify_crc_ = true;
  ServingMeta meta_;
  std::vector<uint64_t> offsets_;                                    // SRVS record of each snapshot
  std::vector<std::shared_ptr<const ServingSnapshot>> checkpoints_;  // [i / kCheckpointEvery]
  std::shared_ptr<ServingSnapshot> cur_;  // the snapshot of cur_index_ (null: none yet)
  int cur_index_ = -1;
};

}  // namespace kvscope::app
