// serving_record.cpp — the serving run file's framing, its writer (ServingRecorder) and its
// reader (ServingReplay); the payloads are serving_codec.cpp (see serving_record.h).
#include "app/core/serving_record.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace kvscope::app {
namespace {

std::string sys_error() {
  return std::strerror(errno);
}

std::string where(const std::string& name) {
  return "serving run file '" + name + "'";
}

// Reads and checks the framing of the record at `offset`.
Expected<RunRecord> read_record(const ByteSource& src, uint64_t offset, const std::string& name,
                                bool verify_crc) {
  return read_run_record(src, offset, where(name),
                         {kTagServingMeta, kTagServingStep, kTagServingEnd}, verify_crc);
}

Error in_record(const std::string& name, const RunRecord& rec, const std::string& msg) {
  return make_error(where(name), ": ", run_record_tag_name(rec.tag), " record at byte ", rec.offset,
                    ": ", msg);
}

std::vector<uint8_t> encode_serving_end(int steps) {
  std::vector<uint8_t> b(4);
  const int32_t v = steps;
  std::memcpy(b.data(), &v, 4);
  return b;
}

// Checks the file header; a single-sequence run is named as such.
Status check_header(const ByteSource& src, const std::string& name) {
  if (src.size() < kRunFileHeaderBytes)
    return make_error(where(name), ": only ", src.size(),
                      " bytes; not a kvscope run file (a run file starts with a 16-byte header)");
  uint8_t head[kRunFileHeaderBytes];
  KV_TRY(src.read(0, head, sizeof head));
  if (std::memcmp(head, kRunFileMagic, sizeof kRunFileMagic) != 0)
    return make_error(where(name),
                      ": not a kvscope run file (bad magic; expected \"KVSRUN\\r\\n\")");
  uint32_t version = 0, flags = 0, first_tag = 0;
  std::memcpy(&version, head + 8, 4);
  std::memcpy(&flags, head + 12, 4);
  if (src.size() >= kRunFileHeaderBytes + 4) KV_TRY(src.read(kRunFileHeaderBytes, &first_tag, 4));
  if (first_tag == kTagRunMeta)
    return make_error(where(name),
                      ": a single-sequence run: open it with --replay (without --view serving)");
  if (version != kServingRunFileVersion)
    return make_error(where(name), ": format version ", version,
                      " is not a serving run (serving runs are version ", kServingRunFileVersion,
                      ")");
  if (flags != 0) return make_error(where(name), ": header flags ", flags, " must be 0");
  return Status::Ok();
}

}  // namespace

// ---- ServingRecorder ----------------------------------------------------------------------

ServingRecorder::~ServingRecorder() {
  if (fd_ >= 0) ::close(fd_);
}

Status ServingRecorder::write_record(uint32_t tag, const std::vector<uint8_t>& payload) {
  const uint64_t len = payload.size();
  const uint32_t crc = crc32(payload.data(), payload.size());
  std::vector<uint8_t> rec(kRunRecordHeaderBytes + payload.size() + kRunRecordTrailerBytes);
  std::memcpy(rec.data(), &tag, 4);
  std::memcpy(rec.data() + 4, &len, 8);
  if (!payload.empty()) std::memcpy(rec.data() + kRunRecordHeaderBytes, payload.data(), len);
  std::memcpy(rec.data() + rec.size() - 4, &crc, 4);
  for (size_t done = 0; done < rec.size();) {
    ssize_t w = ::write(fd_, rec.data() + done, rec.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return make_error("cannot write serving run file '", path_, "': ", sys_error());
    done += size_t(w);
  }
  size_ += rec.size();
  return Status::Ok();
}

Status ServingRecorder::write_step(const ServingSnapshot& s) {
  if (finished_) return make_error("serving run file '", path_, "' is finished; cannot append");
  if (!failed_.empty()) return make_error(failed_);
  if (s.run != meta_.run || s.block_size != meta_.block_size || s.n_blocks != meta_.n_blocks ||
      s.max_batch_tokens != meta_.max_batch_tokens || s.max_seqs != meta_.max_seqs ||
      s.context != meta_.context || s.prefix_caching != meta_.prefix_caching ||
      s.n_requests != meta_.n_requests)
    return make_error("serving run file '", path_, "': the snapshot of step ", s.step,
                      " belongs to another run or configuration (run ", s.run, ", recording run ",
                      meta_.run, ")");
  if (s.step <= mirror_.step)
    return make_error("serving run file '", path_, "': step ", s.step,
                      " does not follow the recorded step ", mirror_.step);
  std::vector<uint8_t> payload =
      encode_serving_step(steps_ == 0 ? nullptr : &mirror_, s, meta_.attention);
  // What a reader will rebuild: the next delta's base, and proof that the record decodes.
  // A snapshot the format cannot hold (a value out of its range) ends the recording: the
  // mirror is then partly changed, so no later delta could be trusted. What was recorded
  // before stays a valid file (finish() still closes it).
  if (Status st = apply_serving_step(meta_, payload.data(), payload.size(), &mirror_); !st.ok()) {
    failed_ = "serving run file '" + path_ + "': recording stopped at step " +
              std::to_string(s.step) + ", which cannot be recorded: " + st.message();
    return make_error(failed_);
  }
  KV_TRY(write_record(kTagServingStep, payload));
  ++steps_;
  return Status::Ok();
}

Expected<std::unique_ptr<ServingRecorder>> ServingRecorder::create(const std::string& path,
                                                                   ServingMeta meta,
                                                                   const ServingSnapshot& first) {
  meta.run = first.run;
  meta.block_size = first.block_size;
  meta.n_blocks = first.n_blocks;
  meta.max_batch_tokens = first.max_batch_tokens;
  meta.max_seqs = first.max_seqs;
  meta.context = first.context;
  meta.prefix_caching = first.prefix_caching;
  meta.n_requests = first.n_requests;
  const std::vector<uint8_t> meta_bytes = encode_serving_meta(meta);
  if (auto m = decode_serving_meta(meta_bytes.data(), meta_bytes.size()); !m.ok())
    return make_error("serving run file '", path,
                      "': the configuration cannot be recorded: ", m.error().message);
  std::unique_ptr<ServingRecorder> r(new ServingRecorder());
  r->path_ = path;
  r->meta_ = std::move(meta);
  r->mirror_ = serving_snapshot_start(r->meta_);
  r->fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (r->fd_ < 0) return make_error("cannot create serving run file '", path, "': ", sys_error());
  uint8_t head[kRunFileHeaderBytes] = {};
  std::memcpy(head, kRunFileMagic, 8);
  std::memcpy(head + 8, &kServingRunFileVersion, 4);
  if (::write(r->fd_, head, sizeof head) != ssize_t(sizeof head))
    return make_error("cannot write serving run file '", path, "': ", sys_error());
  r->size_ = kRunFileHeaderBytes;
  KV_TRY(r->write_record(kTagServingMeta, meta_bytes));
  KV_TRY(r->write_step(first));
  return r;
}

Status ServingRecorder::append(const ServingSnapshot& s) {
  return write_step(s);
}

Status ServingRecorder::finish() {
  if (finished_) return make_error("serving run file '", path_, "' is already finished");
  KV_TRY(write_record(kTagServingEnd, encode_serving_end(steps_)));
  finished_ = true;
  if (::fsync(fd_) != 0)
    return make_error("cannot write serving run file '", path_, "': ", sys_error());
  return Status::Ok();
}

// ---- ServingReplay ------------------------------------------------------------------------

ServingReplay::~ServingReplay() = default;

Expected<std::unique_ptr<ServingReplay>> ServingReplay::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot open serving run file '", path, "': ", sys_error());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("serving run file '", path, "' is not a regular file");
  }
  return open(std::make_unique<FdSource>(fd, uint64_t(st.st_size), /*owned=*/true), path);
}

Expected<std::unique_ptr<ServingReplay>> ServingReplay::open(std::unique_ptr<ByteSource> src,
                                                             const std::string& name,
                                                             bool verify_crc) {
  KV_TRY(check_header(*src, name));
  std::unique_ptr<ServingReplay> rp(new ServingReplay());
  rp->name_ = name;
  rp->verify_crc_ = verify_crc;
  ServingSnapshot s;
  uint64_t at = kRunFileHeaderBytes;
  bool have_meta = false, have_end = false;
  while (at < src->size()) {
    if (have_end)
      return make_error(where(name), ": ", src->size() - at,
                        " bytes after the SRVE record at byte ", at);
    auto rec = read_record(*src, at, name, verify_crc);
    if (!rec.ok()) return rec.error();
    const RunRecord& r = rec.value();
    if (!have_meta && r.tag != kTagServingMeta)
      return make_error(where(name), ": the first record is ", run_record_tag_name(r.tag),
                        ", expected SRVM");
    if (r.tag == kTagServingMeta) {
      if (have_meta) return make_error(where(name), ": a second SRVM record at byte ", r.offset);
      auto m = decode_serving_meta(r.payload.data(), r.payload.size());
      if (!m.ok()) return in_record(name, r, m.error().message);
      rp->meta_ = std::move(m.value());
      s = serving_snapshot_start(rp->meta_);
      have_meta = true;
    } else if (r.tag == kTagServingStep) {
      const int index = int(rp->offsets_.size());
      if (Status st = apply_serving_step(rp->meta_, r.payload.data(), r.payload.size(), &s);
          !st.ok())
        return in_record(name, r, "snapshot " + std::to_string(index) + ": " + st.message());
      if (index % kCheckpointEvery == 0)
        rp->checkpoints_.push_back(std::make_shared<const ServingSnapshot>(s));
      rp->offsets_.push_back(r.offset);
    } else {
      if (r.payload.size() != 4)
        return in_record(
            name, r,
            "payload of " + std::to_string(r.payload.size()) + " bytes, expected 4 (i32 steps)");
      int32_t steps = 0;
      std::memcpy(&steps, r.payload.data(), 4);
      if (steps != int64_t(rp->offsets_.size()))
        return in_record(name, r,
                         "field 'steps': value " + std::to_string(steps) + " but the file holds " +
                             std::to_string(rp->offsets_.size()) + " SRVS records");
      have_end = true;
    }
    at = r.next;
  }
  if (!have_meta) return make_error(where(name), ": the file is truncated (no SRVM record)");
  if (!have_end)
    return make_error(where(name), ": the file is truncated: it ends after ", rp->offsets_.size(),
                      " snapshots at byte ", at, " without its SRVE record");
  if (!rp->offsets_.empty()) {
    // The newest snapshot is where a replay usually starts.
    rp->cur_ = std::make_shared<ServingSnapshot>(std::move(s));
    rp->cur_index_ = rp->steps() - 1;
  }
  rp->src_ = std::move(src);
  return rp;
}

Status ServingReplay::apply_record(int index, ServingSnapshot* s) const {
  auto rec = read_record(*src_, offsets_[size_t(index)], name_, verify_crc_);
  if (!rec.ok()) return rec.error();
  if (rec->tag != kTagServingStep) return in_record(name_, rec.value(), "expected an SRVS record");
  if (Status st = apply_serving_step(meta_, rec->payload.data(), rec->payload.size(), s); !st.ok())
    return in_record(name_, rec.value(), st.message());
  return Status::Ok();
}

Expected<std::shared_ptr<const ServingSnapshot>> ServingReplay::snapshot(int index) {
  if (index < 0 || index >= steps())
    return make_error(where(name_), ": snapshot ", index, " is outside [0, ", steps() - 1, "]");
  if (cur_ && index == cur_index_) return std::shared_ptr<const ServingSnapshot>(cur_);
  const bool forward = cur_ && index > cur_index_ && index - cur_index_ <= kCheckpointEvery;
  if (!forward && index % kCheckpointEvery == 0)
    return checkpoints_[size_t(index / kCheckpointEvery)];
  if (!forward) {
    const int base = index / kCheckpointEvery * kCheckpointEvery;
    cur_ = std::make_shared<ServingSnapshot>(*checkpoints_[size_t(base / kCheckpointEvery)]);
    cur_index_ = base;
  } else if (cur_.use_count() > 1) {
    // Someone still holds it: step on from a copy.
    cur_ = std::make_shared<ServingSnapshot>(*cur_);
  } else {
    // Only this replay holds it: what the last holder did with it happens before this.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  for (int i = cur_index_ + 1; i <= index; ++i) {
    if (Status st = apply_record(i, cur_.get()); !st.ok()) {
      cur_.reset();
      cur_index_ = -1;
      return st.error();
    }
    cur_index_ = i;
  }
  return std::shared_ptr<const ServingSnapshot>(cur_);
}

}  // namespace kvscope::app
