// gguf.cpp — GGUF v2/v3 reader: parsing, validation and metadata getters.
//
// Every field read from the file goes through Reader, which checks that the bytes exist
// before touching them. Counts (key/values, tensors, array elements) are compared with the
// bytes that remain before anything proportional to them is allocated: each element needs
// at least a known minimum number of bytes, so a count that cannot fit is rejected. Tensor
// shapes are checked for zero dimensions, overflow, the block multiple of their type and a
// data range inside the file; then gguf_checks.cpp checks that no two tensors share bytes
// and that well-known metadata values are sane.
#include "engine/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "engine/printable.h"
#include "engine/gguf_checks.h"
#include "engine/quant.h"

namespace kvscope {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Smallest encodings, used to reject counts that cannot fit in the remaining bytes.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, offset

// Name and fixed byte size (0 for string/array) of each metadata value type, by id.
struct ValueTypeInfo {
  const char* name;
  uint64_t size;
  bool integer;
};
constexpr ValueTypeInfo kValueTypes[] = {
    {"u8", 1, true},      {"i8", 1, true},     {"u16", 2, true},  {"i16", 2, true},
    {"u32", 4, true},     {"i32", 4, true},    {"f32", 4, false}, {"bool", 1, false},
    {"string", 0, false}, {"array", 0, false}, {"u64", 8, true},  {"i64", 8, true},
    {"f64", 8, false},
};
constexpr uint32_t kNumValueTypes = sizeof(kValueTypes) / sizeof(kValueTypes[0]);

const char* gguf_type_name(uint32_t t) {
  return t < kNumValueTypes ? kValueTypes[t].name : nullptr;
}

std::string gguf_type_label(GgufType t) {
  const char* n = gguf_type_name(static_cast<uint32_t>(t));
  return n ? n : "type " + std::to_string(static_cast<uint32_t>(t));
}

// Size in bytes of a fixed-width scalar value type; 0 for string/array/unknown.
uint64_t scalar_size(uint32_t t) {
  return t < kNumValueTypes ? kValueTypes[t].size : 0;
}

bool is_integer_type(GgufType t) {
  const auto id = static_cast<uint32_t>(t);
  return id < kNumValueTypes && kValueTypes[id].integer;
}

bool is_unsigned_type(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}

// Bounds-checked little-endian cursor over the file bytes.
class Reader {
 public:
  Reader(const uint8_t* base, uint64_t size, const std::string& name)
      : base_(base), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Error truncated(const std::string& what, uint64_t need) const {
    return make_error("gguf: ", name_, ": truncated file: ", what, " needs ", need,
                      " bytes at offset ", pos_, " but the file has ", size_, " bytes");
  }

  template <class T>
  Expected<T> read(const std::string& what) {
    if (remaining() < sizeof(T)) return truncated(what, sizeof(T));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Expected<std::string> read_string(const std::string& what) {
    auto len = read<uint64_t>(what + " length");
    if (!len) return len.error();
    if (*len > remaining()) {
      return make_error("gguf: ", name_, ": ", what, " length ", *len, " at offset ", pos_ - 8,
                        " exceeds the ", remaining(), " bytes left in the file");
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(*len));
    pos_ += *len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

// Reads one T into v, widened: floats into f, signed into i, unsigned into u (and into i
// when it fits).
template <class T>
Status read_into(Reader& r, const std::string& what, GgufValue& v) {
  auto x = r.read<T>(what);
  if (!x) return x.error();
  if constexpr (std::is_floating_point_v<T>) {
    v.f = *x;
  } else if constexpr (std::is_signed_v<T>) {
    v.i = *x;
  } else {
    v.u = *x;
    if (*x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      v.i = static_cast<int64_t>(*x);
    }
  }
  return Status::Ok();
}

// Reads one scalar of type t into v (widened).
Status read_scalar(Reader& r, uint32_t t, GgufValue& v, const std::string& what,
                   const std::string& file) {
  switch (static_cast<GgufType>(t)) {
    case GgufType::U8:
      return read_into<uint8_t>(r, what, v);
    case GgufType::I8:
      return read_into<int8_t>(r, what, v);
    case GgufType::U16:
      return read_into<uint16_t>(r, what, v);
    case GgufType::I16:
      return read_into<int16_t>(r, what, v);
    case GgufType::U32:
      return read_into<uint32_t>(r, what, v);
    case GgufType::I32:
      return read_into<int32_t>(r, what, v);
    case GgufType::U64:
      return read_into<uint64_t>(r, what, v);
    case GgufType::I64:
      return read_into<int64_t>(r, what, v);
    case GgufType::F32:
      return read_into<float>(r, what, v);
    case GgufType::F64:
      return read_into<double>(r, what, v);
    case GgufType::BOOL: {
      uint64_t at = r.pos();
      auto x = r.read<uint8_t>(what);
      if (!x) return x.error();
      if (*x > 1) {
        return make_error("gguf: ", file, ": ", what, " at offset ", at,
                          " is a bool with byte value ", static_cast<int>(*x),
                          " (allowed: 0 or 1)");
      }
      v.i = *x;
      return Status::Ok();
    }
    default:
      break;
  }
  return make_error("gguf: ", file, ": ", what, ": value type ", t, " is not a scalar");
}

Status read_array(Reader& r, GgufValue& v, const std::string& what, const std::string& file) {
  uint64_t at = r.pos();
  auto et = r.read<uint32_t>(what + " element type");
  if (!et) return et.error();
  if (*et == static_cast<uint32_t>(GgufType::ARRAY)) {
    return make_error("gguf: ", file, ": ", what, " at offset ", at,
                      " is an array of arrays; nested arrays are not supported");
  }
  if (!gguf_type_name(*et)) {
    return make_error("gguf: ", file, ": ", what, " at offset ", at,
                      ": unknown array element type ", *et, " (allowed 0..12)");
  }
  auto count = r.read<uint64_t>(what + " element count");
  if (!count) return count.error();
  const bool strings = *et == static_cast<uint32_t>(GgufType::STRING);
  const uint64_t min_elem = strings ? 8 : scalar_size(*et);
  if (*count > r.remaining() / min_elem) {
    return make_error("gguf: ", file, ": ", what, ": array of ", *count, " ", gguf_type_name(*et),
                      " elements (at least ", min_elem, " bytes each) does not fit in the ",
                      r.remaining(), " bytes left in the file");
  }
  v.elem_type = static_cast<GgufType>(*et);
  v.array_len = *count;
  if (strings) {
    v.strs.reserve(*count);
    for (uint64_t k = 0; k < *count; ++k) {
      auto s = r.read_string(what + "[" + std::to_string(k) + "]");
      if (!s) return s.error();
      v.strs.push_back(std::move(*s));
    }
    return Status::Ok();
  }
  const bool floating = v.elem_type == GgufType::F32 || v.elem_type == GgufType::F64;
  if (floating)
    v.floats.reserve(*count);
  else
    v.ints.reserve(*count);
  GgufValue tmp;
  for (uint64_t k = 0; k < *count; ++k) {
    tmp.i = 0;
    tmp.u = 0;
    KV_TRY(read_scalar(r, *et, tmp, what, file));
    if (floating) {
      v.floats.push_back(tmp.f);
    } else if (is_unsigned_type(v.elem_type)) {
      // u64 values above INT64_MAX keep their bit pattern; get_int_array rejects them.
      v.ints.push_back(static_cast<int64_t>(tmp.u));
    } else {
      v.ints.push_back(tmp.i);
    }
  }
  return Status::Ok();
}

Expected<GgufValue> read_value(Reader& r, const std::string& key, const std::string& file) {
  const std::string what = "metadata key '" + printable_name(key) + "'";
  uint64_t at = r.pos();
  auto t = r.read<uint32_t>(what + " value type");
  if (!t) return t.error();
  if (!gguf_type_name(*t)) {
    return make_error("gguf: ", file, ": ", what, " at offset ", at, ": unknown value type ", *t,
                      " (allowed 0..12)");
  }
  GgufValue v;
  v.type = static_cast<GgufType>(*t);
  if (v.type == GgufType::STRING) {
    auto s = r.read_string(what + " string value");
    if (!s) return s.error();
    v.s = std::move(*s);
  } else if (v.type == GgufType::ARRAY) {
    KV_TRY(read_array(r, v, what, file));
  } else {
    KV_TRY(read_scalar(r, *t, v, what, file));
  }
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

std::string dims_string(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  return s + "]";
}

// Validates one tensor's shape and type and computes nbytes.
Status check_tensor_shape(TensorInfo& ti, uint32_t type_id, const std::string& file) {
  const std::string what = "gguf: " + file + ": tensor '" + printable_name(ti.name) + "'";
  const TypeTraits* tt = type_traits(type_id);
  if (!tt) {
    return make_error(what, ": unknown ggml type id ", type_id,
                      " (not a type this reader knows; the file may need a newer reader)");
  }
  ti.type = static_cast<GgmlType>(type_id);
  uint64_t n = 1;
  for (size_t d = 0; d < ti.ne.size(); ++d) {
    if (ti.ne[d] == 0) {
      return make_error(what, ": dimension ne[", d, "] is 0 in shape ", dims_string(ti.ne),
                        " (every dimension must be at least 1)");
    }
    if (mul_overflows(n, ti.ne[d], &n) ||
        n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return make_error(what, ": element count of shape ", dims_string(ti.ne),
                        " overflows 63 bits");
    }
  }
  if (ti.ne[0] % tt->block_size != 0) {
    return make_error(what, ": row length ne[0] = ", ti.ne[0], " is not a multiple of the ",
                      tt->name, " block size ", tt->block_size);
  }
  const uint64_t rows = n / ti.ne[0];
  const uint64_t rb =
      (ti.ne[0] / tt->block_size) * tt->type_size;  // cannot overflow: <= n*type_size/...
  uint64_t nbytes = 0;
  if (mul_overflows(rb, rows, &nbytes)) {
    return make_error(what, ": byte size of shape ", dims_string(ti.ne), " as ", tt->name,
                      " overflows 64 bits");
  }
  ti.nbytes = nbytes;
  return Status::Ok();
}

}  // namespace

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return ne.empty() ? 0 : n;
}

namespace {

// The live file mappings, for gguf_release_pages.
struct Mappings {
  std::mutex mutex;
  std::vector<std::pair<const uint8_t*, uint64_t>> live;  // (base, size)
};
Mappings& mappings() {
  static Mappings* m = new Mappings;  // never destroyed: files may close during exit
  return *m;
}

}  // namespace

void gguf_release_pages(const void* p, uint64_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  Mappings& m = mappings();
  std::lock_guard<std::mutex> lock(m.mutex);
  for (const auto& [base, size] : m.live) {
    if (b < base || n > size || uint64_t(b - base) > size - n) continue;
    const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
    const uint64_t lo = (reinterpret_cast<uintptr_t>(b) + page - 1) / page * page;
    const uint64_t hi = (reinterpret_cast<uintptr_t>(b) + n) / page * page;
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), size_t(hi - lo), MADV_DONTNEED);
    return;
  }
}

GgufFile::~GgufFile() {
  if (map_) {
    Mappings& m = mappings();
    std::lock_guard<std::mutex> lock(m.mutex);
    std::erase(m.live, std::pair<const uint8_t*, uint64_t>(base_, size_));
    munmap(map_, static_cast<size_t>(size_));
  }
}

Expected<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path_bytes) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path_bytes;
  const std::string path = printable_name(path_bytes);  // for messages
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error("gguf: ", path, ": cannot open: ", std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error("gguf: ", path, ": cannot stat: ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("gguf: ", path, ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return make_error("gguf: ", path, ": truncated file: the file is empty (0 bytes)");
  }
  void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    return make_error("gguf: ", path, ": cannot map ", static_cast<uint64_t>(st.st_size),
                      " bytes: ", std::strerror(e));
  }
  f->map_ = m;
  f->base_ = static_cast<const uint8_t*>(m);
  f->size_ = static_cast<uint64_t>(st.st_size);
  {
    Mappings& reg = mappings();
    std::lock_guard<std::mutex> lock(reg.mutex);
    reg.live.push_back({f->base_, f->size_});
  }
  return parse(std::move(f));
}

Expected<std::unique_ptr<GgufFile>> GgufFile::from_bytes(std::vector<uint8_t> bytes,
                                                         std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  return parse(std::move(f));
}

Expected<std::unique_ptr<GgufFile>> GgufFile::parse(std::unique_ptr<GgufFile> f) {
  const std::string file = printable_name(f->path_);  // file-derived text in messages is escaped
  Reader r(f->base_, f->size_, file);

  // Header.
  if (f->size_ < 4) return r.truncated("header magic", 4);
  if (std::memcmp(f->base_, "GGUF", 4) != 0) {
    std::string got;
    for (int k = 0; k < 4; ++k) {
      const uint8_t c = f->base_[k];
      if (c >= 0x20 && c < 0x7f) {
        got += static_cast<char>(c);
      } else {
        static const char* hex = "0123456789abcdef";
        got += "\\x";
        got += hex[c >> 4];
        got += hex[c & 15];
      }
    }
    return make_error("gguf: ", file, ": bad magic '", got, "' (expected 'GGUF'; not a GGUF file)");
  }
  (void)r.read<uint32_t>("magic");
  auto version = r.read<uint32_t>("header version");
  if (!version) return version.error();
  if (*version != 2 && *version != 3) {
    return make_error("gguf: ", file, ": unsupported GGUF version ", *version,
                      " (supported: 2, 3)");
  }
  f->version_ = *version;
  auto n_tensors = r.read<uint64_t>("header tensor_count");
  if (!n_tensors) return n_tensors.error();
  auto n_kv = r.read<uint64_t>("header metadata_kv_count");
  if (!n_kv) return n_kv.error();
  if (*n_kv > r.remaining() / kMinKvBytes) {
    return make_error("gguf: ", file, ": metadata_kv_count ", *n_kv, " cannot fit in the ",
                      r.remaining(), " bytes after the header (each key/value needs at least ",
                      kMinKvBytes, " bytes)");
  }
  if (*n_tensors > r.remaining() / kMinTensorInfoBytes) {
    return make_error("gguf: ", file, ": tensor_count ", *n_tensors, " cannot fit in the ",
                      r.remaining(), " bytes after the header (each tensor info needs at least ",
                      kMinTensorInfoBytes, " bytes)");
  }

  // Metadata.
  f->kv_.reserve(*n_kv);
  std::unordered_set<std::string> keys;
  for (uint64_t k = 0; k < *n_kv; ++k) {
    auto key = r.read_string("metadata key #" + std::to_string(k));
    if (!key) return key.error();
    if (!keys.insert(*key).second) {
      return make_error("gguf: ", file, ": duplicate metadata key '", printable_name(*key), "' (key #",
                        k, ")");
    }
    auto value = read_value(r, *key, file);
    if (!value) return value.error();
    f->kv_.emplace_back(std::move(*key), std::move(*value));
  }
  if (const GgufValue* a = f->find("general.alignment")) {
    if (!is_integer_type(a->type)) {
      return make_error("gguf: ", file, ": general.alignment has type ", gguf_type_label(a->type),
                        " (expected an unsigned integer)");
    }
    const bool neg = !is_unsigned_type(a->type) && a->i < 0;
    const uint64_t al = is_unsigned_type(a->type) ? a->u : static_cast<uint64_t>(a->i);
    if (neg || al == 0 || (al & (al - 1)) != 0 || al > (uint64_t{1} << 30)) {
      return make_error("gguf: ", file,
                        ": general.alignment = ", neg ? std::to_string(a->i) : std::to_string(al),
                        " is not a power of two in 1..2^30");
    }
    f->alignment_ = al;
  } else {
    f->alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  f->tensors_.reserve(*n_tensors);
  std::vector<uint32_t> type_ids;
  std::unordered_set<std::string> names;
  for (uint64_t k = 0; k < *n_tensors; ++k) {
    TensorInfo ti;
    auto name = r.read_string("tensor info #" + std::to_string(k) + " name");
    if (!name) return name.error();
    ti.name = std::move(*name);
    const std::string what = "tensor '" + printable_name(ti.name) + "'";
    if (!names.insert(ti.name).second) {
      return make_error("gguf: ", file, ": duplicate tensor name '", printable_name(ti.name),
                        "' (tensor #", k, ")");
    }
    auto n_dims = r.read<uint32_t>(what + " n_dims");
    if (!n_dims) return n_dims.error();
    if (*n_dims < 1 || *n_dims > kMaxDims) {
      return make_error("gguf: ", file, ": ", what, ": n_dims ", *n_dims, " is out of range 1..",
                        kMaxDims);
    }
    for (uint32_t d = 0; d < *n_dims; ++d) {
      auto ne = r.read<uint64_t>(what + " ne[" + std::to_string(d) + "]");
      if (!ne) return ne.error();
      ti.ne.push_back(*ne);
    }
    auto type = r.read<uint32_t>(what + " type");
    if (!type) return type.error();
    auto offset = r.read<uint64_t>(what + " offset");
    if (!offset) return offset.error();
    ti.offset = *offset;
    KV_TRY(check_tensor_shape(ti, *type, file));
    f->tensors_.push_back(std::move(ti));
  }

  // Data section.
  const uint64_t info_end = r.pos();
  const uint64_t al = f->alignment_;
  const uint64_t data_start = (info_end + al - 1) / al * al;  // al <= 2^30, info_end <= size
  for (TensorInfo& ti : f->tensors_) {
    const std::string what = "gguf: " + file + ": tensor '" + printable_name(ti.name) + "'";
    if (ti.offset % al != 0) {
      return make_error(what, ": offset ", ti.offset, " is not a multiple of the alignment ", al);
    }
    if (data_start > f->size_) {
      return make_error(what, ": the data section would start at offset ", data_start,
                        ", past the end of the file (", f->size_,
                        " bytes); the tensor data is truncated");
    }
    const uint64_t avail = f->size_ - data_start;
    if (ti.offset > avail || ti.nbytes > avail - ti.offset) {
      return make_error(what, ": offset ", ti.offset, " + ", ti.nbytes,
                        " bytes is past the end of the file (", f->size_,
                        " bytes; data section starts at ", data_start, ")");
    }
    ti.data = f->base_ + data_start + ti.offset;
  }
  KV_TRY(check_tensor_layout(f->tensors_, file));
  KV_TRY(check_metadata_ranges(*f, file));
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : kv_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

Error missing(const std::string& file, std::string_view key) {
  return make_error("gguf: ", printable_name(file), ": metadata key '", printable_name(key),
                    "' is missing");
}

Error wrong_type(const std::string& file, std::string_view key, const GgufValue& v,
                 const char* expected) {
  std::string got = gguf_type_label(v.type);
  if (v.type == GgufType::ARRAY) got += " of " + gguf_type_label(v.elem_type);
  return make_error("gguf: ", printable_name(file), ": metadata key '", printable_name(key),
                    "' has type ", got, ", expected ",
                    expected);
}

}  // namespace

Expected<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::STRING) return wrong_type(path_, key, *v, "string");
  return v->s;
}

Expected<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (!is_integer_type(v->type)) return wrong_type(path_, key, *v, "an integer");
  if (v->type == GgufType::U64 &&
      v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return make_error("gguf: ", printable_name(path_), ": metadata key '", printable_name(key),
                      "' = ", v->u,
                      " is out of range for a signed 64-bit integer");
  }
  return v->i;
}

Expected<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type == GgufType::F32 || v->type == GgufType::F64) return v->f;
  if (is_integer_type(v->type)) {
    return is_unsigned_type(v->type) ? static_cast<double>(v->u) : static_cast<double>(v->i);
  }
  return wrong_type(path_, key, *v, "a number");
}

Expected<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::BOOL) return wrong_type(path_, key, *v, "bool");
  return v->i != 0;
}

Expected<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::ARRAY || v->elem_type != GgufType::STRING) {
    return wrong_type(path_, key, *v, "array of string");
  }
  return v->strs;
}

Expected<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::ARRAY ||
      !(is_integer_type(v->elem_type) || v->elem_type == GgufType::BOOL)) {
    return wrong_type(path_, key, *v, "array of integers");
  }
  if (v->elem_type == GgufType::U64) {
    for (size_t k = 0; k < v->ints.size(); ++k) {
      if (v->ints[k] < 0) {
        return make_error("gguf: ", printable_name(path_), ": metadata key '", printable_name(key),
                          "'[", k,
                          "] = ", static_cast<uint64_t>(v->ints[k]),
                          " is out of range for a signed 64-bit integer");
      }
    }
  }
  return v->ints;
}

Expected<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (v->type != GgufType::ARRAY) return wrong_type(path_, key, *v, "array of numbers");
  if (v->elem_type == GgufType::F32 || v->elem_type == GgufType::F64) return v->floats;
  if (is_integer_type(v->elem_type)) {
    std::vector<double> out;
    out.reserve(v->ints.size());
    const bool u64 = v->elem_type == GgufType::U64;
    for (int64_t x : v->ints) {
      out.push_back(u64 ? static_cast<double>(static_cast<uint64_t>(x)) : static_cast<double>(x));
    }
    return out;
  }
  return wrong_type(path_, key, *v, "array of numbers");
}

std::string ggml_type_name(uint32_t id) {
  const TypeTraits* t = type_traits(id);
  return t ? std::string(t->name) : "type " + std::to_string(id);
}

std::string ggml_type_name(GgmlType t) {
  return ggml_type_name(static_cast<uint32_t>(t));
}

}  // namespace kvscope
