// run_file.cpp — run file framing, validation, and the writer/reader (see run_file.h).
#include "app/core/run_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace kvscope::app {
namespace {

constexpr const char (&kMagic)[8] = kRunFileMagic;
constexpr uint64_t kFileHeaderBytes = kRunFileHeaderBytes;
constexpr uint64_t kRecordHeaderBytes = kRunRecordHeaderBytes;
constexpr uint64_t kRecordTrailerBytes = kRunRecordTrailerBytes;
constexpr uint64_t kMaxPayload = 1ull << 36;  // 64 GiB: far above any real step

constexpr uint32_t kTagMeta = kTagRunMeta;
constexpr uint32_t kTagStep = run_record_tag("STEP");
constexpr uint32_t kTagEnd = run_record_tag("END ");

std::string tag_name(uint32_t tag) {
  return run_record_tag_name(tag);
}

std::string sys_error() {
  return std::strerror(errno);
}

Expected<RunRecord> read_record(const ByteSource& src, uint64_t offset, const std::string& name,
                                bool verify_crc) {
  return read_run_record(src, offset, "run file '" + name + "'", {kTagMeta, kTagStep, kTagEnd},
                         verify_crc);
}

Status with_context(const Error& e, const std::string& name, const RunRecord& rec) {
  return make_error("run file '", name, "': ", tag_name(rec.tag), " record at byte ", rec.offset,
                    ": ", e.message);
}

}  // namespace

std::string run_record_tag_name(uint32_t tag) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    char c = char((tag >> (8 * i)) & 0xFF);
    s += (c >= 0x20 && c < 0x7F) ? c : '?';
  }
  return s;
}

FdSource::~FdSource() {
  if (owned_) ::close(fd_);
}

Status FdSource::read(uint64_t offset, void* dst, size_t n) const {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd_, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return make_error("read failed at byte ", offset, ": ", sys_error());
    if (r == 0) return make_error("the file ends at byte ", offset, " (it was cut short)");
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
  return Status::Ok();
}

Expected<RunRecord> read_run_record(const ByteSource& src, uint64_t offset,
                                    const std::string& file, std::initializer_list<uint32_t> tags,
                                    bool verify_crc) {
  auto where = [&] { return file + ": record at byte " + std::to_string(offset); };
  const uint64_t size = src.size();
  if (offset > size || size - offset < kRecordHeaderBytes)
    return make_error(where(), ": the file is truncated (", size - std::min(offset, size),
                      " bytes left, a record header needs ", kRecordHeaderBytes, ")");
  uint8_t head[kRecordHeaderBytes];
  KV_TRY(src.read(offset, head, sizeof head));
  RunRecord rec;
  rec.offset = offset;
  uint64_t len = 0;
  std::memcpy(&rec.tag, head, 4);
  std::memcpy(&len, head + 4, 8);
  if (std::find(tags.begin(), tags.end(), rec.tag) == tags.end()) {
    std::string expected;  // "META, STEP or END"
    size_t i = 0;
    for (uint32_t t : tags) {
      std::string n = tag_name(t);
      while (!n.empty() && n.back() == ' ') n.pop_back();
      expected += (i == 0 ? "" : i + 1 == tags.size() ? " or " : ", ") + n;
      ++i;
    }
    return make_error(where(), ": unknown record tag '", tag_name(rec.tag), "' (expected ",
                      expected, ")");
  }
  const uint64_t left = size - offset - kRecordHeaderBytes;
  if (len > kMaxPayload || left < kRecordTrailerBytes || len > left - kRecordTrailerBytes)
    return make_error(where(), ": ", tag_name(rec.tag), " payload of ", len,
                      " bytes runs past the end of the file (", left,
                      " bytes left); the file is truncated or corrupted");
  rec.payload.resize(size_t(len));
  KV_TRY(src.read(offset + kRecordHeaderBytes, rec.payload.data(), size_t(len)));
  uint32_t crc = 0;
  KV_TRY(src.read(offset + kRecordHeaderBytes + len, &crc, 4));
  if (verify_crc && crc != crc32(rec.payload.data(), rec.payload.size()))
    return make_error(where(), ": ", tag_name(rec.tag),
                      " checksum mismatch (the file is corrupted)");
  rec.next = offset + kRecordHeaderBytes + len + kRecordTrailerBytes;
  return rec;
}

Status BufferSource::read(uint64_t offset, void* dst, size_t n) const {
  if (offset > n_ || n > n_ - offset) return make_error("read past the end of the buffer");
  if (n > 0) std::memcpy(dst, p_ + offset, n);  // dst may be null for n = 0
  return Status::Ok();
}

Expected<RunIndex> index_run(const ByteSource& src, const std::string& name, bool verify_crc) {
  const std::string what = "run file '" + name + "'";
  if (src.size() < kFileHeaderBytes)
    return make_error(what, ": only ", src.size(),
                      " bytes; not a kvscope run file (a run file "
                      "starts with a 16-byte header)");
  uint8_t head[kFileHeaderBytes];
  KV_TRY(src.read(0, head, sizeof head));
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0)
    return make_error(what, ": not a kvscope run file (bad magic; expected \"KVSRUN\\r\\n\")");
  uint32_t version = 0, flags = 0;
  std::memcpy(&version, head + 8, 4);
  std::memcpy(&flags, head + 12, 4);
  // A serving run (serving_record.h) is told apart by its first record, whatever the version.
  uint32_t first_tag = 0;
  if (src.size() >= kFileHeaderBytes + 4) KV_TRY(src.read(kFileHeaderBytes, &first_tag, 4));
  if (first_tag == kTagServingMeta)
    return make_error(what, ": a serving run: open it with --view serving --replay");
  if (version == kServingRunFileVersion)
    return make_error(what, ": format version ", version,
                      " is not supported for a single-sequence run (this kvscope reads versions ",
                      kRunFileOldestVersion, " to ", kRunFileVersion,
                      "; version 3 files hold serving runs, and this one's first record is ",
                      tag_name(first_tag), ", not SRVM)");
  if (version < kRunFileOldestVersion || version > kRunFileVersion)
    return make_error(what, ": format version ", version,
                      " is not supported (this kvscope reads versions ", kRunFileOldestVersion,
                      " to ", kRunFileVersion, ")");
  if (flags != 0) return make_error(what, ": header flags ", flags, " must be 0");

  RunIndex idx;
  uint64_t at = kFileHeaderBytes;
  bool have_meta = false, have_end = false;
  while (at < src.size()) {
    if (have_end)
      return make_error(what, ": ", src.size() - at, " bytes after the END record at byte ", at);
    auto rec = read_record(src, at, name, verify_crc);
    if (!rec.ok()) return rec.error();
    const RunRecord& r = rec.value();
    if (!have_meta && r.tag != kTagMeta)
      return make_error(what, ": the first record is ", tag_name(r.tag), ", expected META");
    if (r.tag == kTagMeta) {
      if (have_meta) return make_error(what, ": a second META record at byte ", r.offset);
      auto m = decode_meta(r.payload.data(), r.payload.size());
      if (!m.ok()) return with_context(m.error(), name, r).error();
      idx.meta = std::move(m.value());
      have_meta = true;
    } else if (r.tag == kTagStep) {
      auto t = decode_step(r.payload.data(), r.payload.size());
      if (!t.ok()) return with_context(t.error(), name, r).error();
      const int want = int(idx.steps.size()) + 1;
      if (t->step != want)
        return make_error(what, ": STEP record at byte ", r.offset, " is step ", t->step,
                          ", expected step ", want, " (steps must be consecutive from 1)");
      const ModelFacts& f = idx.meta.model;
      if (t->n_layer != f.n_layer || (t->n_head != 0 && t->n_head != f.n_head))
        return make_error(what, ": STEP ", t->step, " has ", t->n_layer, " layers x ", t->n_head,
                          " heads but META says ", f.n_layer, " x ", f.n_head);
      idx.steps.push_back(r.offset);
    } else {
      auto e = decode_end(r.payload.data(), r.payload.size());
      if (!e.ok()) return with_context(e.error(), name, r).error();
      if (e->steps != int(idx.steps.size()))
        return make_error(what, ": END says ", e->steps, " steps but the file holds ",
                          idx.steps.size());
      idx.end = std::move(e.value());
      have_end = true;
    }
    at = r.next;
  }
  if (!have_meta) return make_error(what, ": the file is truncated (no META record)");
  if (!have_end)
    return make_error(what, ": the file is truncated: it ends after step ", idx.steps.size(),
                      " at byte ", at, " without its END record");
  return idx;
}

Expected<StepTrace> read_step_record(const ByteSource& src, uint64_t offset,
                                     const std::string& name, bool verify_crc) {
  auto rec = read_record(src, offset, name, verify_crc);
  if (!rec.ok()) return rec.error();
  if (rec->tag != kTagStep)
    return make_error("run file '", name, "': the record at byte ", offset, " is ",
                      tag_name(rec->tag), ", not STEP");
  auto t = decode_step(rec->payload.data(), rec->payload.size());
  if (!t.ok()) return with_context(t.error(), name, rec.value()).error();
  return t;
}

// ---- RunFile ----------------------------------------------------------------------------

RunFile::~RunFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// Writes one record (tag, length, payload, CRC) at byte `at` of fd. Returns the byte after
// it, or the system's reason it could not.
Expected<uint64_t> pwrite_record(int fd, uint64_t at, uint32_t tag,
                                 const std::vector<uint8_t>& payload) {
  const uint64_t len = payload.size();
  const uint32_t crc = crc32(payload.data(), payload.size());
  uint8_t head[kRecordHeaderBytes];
  std::memcpy(head, &tag, 4);
  std::memcpy(head + 4, &len, 8);
  for (auto [p, n] : {std::pair<const void*, size_t>{head, sizeof head},
                      std::pair<const void*, size_t>{payload.data(), payload.size()},
                      std::pair<const void*, size_t>{&crc, 4}}) {
    const auto* c = static_cast<const uint8_t*>(p);
    while (n > 0) {
      ssize_t w = ::pwrite(fd, c, n, off_t(at));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return make_error(sys_error());
      c += w;
      n -= size_t(w);
      at += uint64_t(w);
    }
  }
  return at;
}

}  // namespace

Status RunFile::write_record(uint32_t tag, const std::vector<uint8_t>& payload) {
  auto at = pwrite_record(fd_, size_.load(), tag, payload);
  if (!at.ok()) return make_error("cannot write run file '", name_, "': ", at.error().message);
  size_.store(at.value());
  return Status::Ok();
}

Expected<std::shared_ptr<RunFile>> RunFile::begin(int fd, std::string name, const RunMeta& meta,
                                                  uint64_t attention_cap) {
  std::shared_ptr<RunFile> f(new RunFile());
  f->fd_ = fd;
  f->name_ = std::move(name);
  f->meta_ = meta;
  f->cap_ = attention_cap;
  uint8_t head[kFileHeaderBytes] = {};
  std::memcpy(head, kMagic, 8);
  std::memcpy(head + 8, &kRunFileVersion, 4);
  if (::pwrite(fd, head, sizeof head, 0) != ssize_t(sizeof head))
    return make_error("cannot write run file '", f->name_, "': ", sys_error());
  f->size_ = kFileHeaderBytes;
  KV_TRY(f->write_record(kTagMeta, encode_meta(meta)));
  return f;
}

Expected<std::shared_ptr<RunFile>> RunFile::create(const std::string& path, const RunMeta& meta,
                                                   uint64_t attention_cap) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error("cannot create run file '", path, "': ", sys_error());
  return begin(fd, path, meta, attention_cap);
}

Expected<std::shared_ptr<RunFile>> RunFile::create_spool(const std::string& dir,
                                                         const RunMeta& meta,
                                                         uint64_t attention_cap) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {  // no O_TMPFILE on this file system: a named file, unlinked at once
    std::string tmpl = dir + "/kvscope-spool-XXXXXX";
    fd = ::mkstemp(tmpl.data());
    if (fd < 0)
      return make_error("cannot create the history spool in '", dir, "': ", sys_error(),
                        " (set KVSCOPE_SPOOL_DIR to a writable directory)");
    ::unlink(tmpl.c_str());
  }
  return begin(fd, dir + "/(history spool)", meta, attention_cap);
}

Expected<std::shared_ptr<RunFile>> RunFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot open run file '", path, "': ", sys_error());
  std::shared_ptr<RunFile> f(new RunFile());
  f->fd_ = fd;
  f->name_ = path;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return make_error("run file '", path, "' is not a regular file");
  f->size_ = uint64_t(st.st_size);
  auto idx = index_run(FdSource(fd, uint64_t(st.st_size)), path);
  if (!idx.ok()) return idx.error();
  f->meta_ = std::move(idx->meta);
  f->end_ = std::move(idx->end);
  f->steps_ = std::move(idx->steps);
  f->finished_ = true;
  return f;
}

Expected<uint64_t> RunFile::append_step(const StepTrace& t) {
  if (finished_) return make_error("run file '", name_, "' is finished; cannot append");
  AttnEncoding enc = meta_.attention;
  std::vector<uint8_t> payload = encode_step(t, enc);
  if (cap_ > 0 && size_.load() + payload.size() + kRecordHeaderBytes > cap_ &&
      enc != AttnEncoding::None) {
    payload = encode_step(t, AttnEncoding::None);
    dropped_ = true;
  }
  const uint64_t at = size_.load();
  KV_TRY(write_record(kTagStep, payload));
  steps_.push_back(at);
  return at;
}

Status RunFile::finish(const RunEnd& end) {
  if (finished_) return make_error("run file '", name_, "' is already finished");
  KV_TRY(write_record(kTagEnd, encode_end(end)));
  end_ = end;
  finished_ = true;
  if (::fsync(fd_) != 0) return make_error("cannot write run file '", name_, "': ", sys_error());
  return Status::Ok();
}

Status RunFile::save_copy(const std::string& path, const RunEnd& end) const {
  const std::string tmp = path + ".part";
  int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return make_error("cannot create '", tmp, "': ", sys_error());
  auto fail = [&](const std::string& why) {
    ::close(out);
    ::unlink(tmp.c_str());
    return Status(make_error("cannot save the run to '", path, "': ", why));
  };
  // Everything appended so far; a finished file is copied without its old END record.
  const uint64_t total = size_.load();
  FdSource src(fd_, total);
  uint64_t stop = total;
  if (finished_) {
    stop = steps_.empty() ? kFileHeaderBytes : 0;
    if (!steps_.empty()) {
      auto last = read_record(src, steps_.back(), name_, false);
      if (!last.ok()) return fail(last.error().message);
      stop = last->next;
    } else {
      auto meta = read_record(src, kFileHeaderBytes, name_, false);
      if (!meta.ok()) return fail(meta.error().message);
      stop = meta->next;
    }
  }
  std::vector<uint8_t> buf(1 << 20);
  uint64_t copied = 0;
  while (copied < stop) {
    size_t n = size_t(std::min<uint64_t>(buf.size(), stop - copied));
    if (Status st = src.read(copied, buf.data(), n); !st.ok()) return fail(st.message());
    for (size_t done = 0; done < n;) {
      ssize_t w = ::write(out, buf.data() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return fail(sys_error());
      done += size_t(w);
    }
    copied += n;
  }
  if (auto at = pwrite_record(out, stop, kTagEnd, encode_end(end)); !at.ok())
    return fail(at.error().message);
  if (::fsync(out) != 0) return fail(sys_error());
  ::close(out);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = sys_error();
    ::unlink(tmp.c_str());
    return make_error("cannot save the run to '", path, "': ", why);
  }
  return Status::Ok();
}

Expected<StepTrace> RunFile::read_step(uint64_t offset) const {
  return read_step_record(FdSource(fd_, size_.load()), offset, name_);
}

}  // namespace kvscope::app
