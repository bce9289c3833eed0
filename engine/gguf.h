// gguf.h — read-only GGUF (v2/v3) file: metadata and tensor views.
//
// The file is memory-mapped (or held in memory for tests and fuzzing) and validated
// completely on open: every count, length, dimension and offset is checked against the
// file size and for overflow before it is used. After a successful open every
// TensorInfo points at nbytes of readable data inside the mapping. Nothing here
// allocates in proportion to an unchecked count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvscope {

// ggml tensor type ids (the numbering stored in GGUF tensor infos).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

// GGUF metadata value types.
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

// One metadata value. Scalars are widened: integers (and bool) into i64/u64, floats
// into f64. Arrays keep their element type; numeric arrays are widened the same way.
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // for ARRAY
  int64_t i = 0;                      // signed integer scalars and bool
  uint64_t u = 0;                     // unsigned integer scalars (also mirrored into i when it fits)
  double f = 0;                       // F32/F64 scalars
  std::string s;                      // STRING
  std::vector<std::string> strs;      // ARRAY of STRING
  std::vector<int64_t> ints;          // ARRAY of any integer type / bool
  std::vector<double> floats;         // ARRAY of F32/F64
  uint64_t array_len = 0;             // ARRAY element count
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] = row length (fastest varying); 1..4 dims
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to the data section
  const uint8_t* data = nullptr;  // inside the mapping, nbytes readable
  uint64_t nbytes = 0;
  uint64_t n_elements() const;
};

class GgufFile {
 public:
  // Maps and validates a file. Errors name the file, the field, the value and the
  // allowed range.
  static Expected<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Same validation over bytes already in memory (tests, fuzzing). `name` is used in
  // error messages.
  static Expected<std::unique_ptr<GgufFile>> from_bytes(std::vector<uint8_t> bytes,
                                                       std::string name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: an error when the key is missing or has an incompatible type or an
  // out-of-range value. Integers accept any stored integer width.
  Expected<std::string> get_string(std::string_view key) const;
  Expected<int64_t> get_int(std::string_view key) const;
  Expected<double> get_float(std::string_view key) const;  // accepts F32/F64 and integers
  Expected<bool> get_bool(std::string_view key) const;
  Expected<std::vector<std::string>> get_string_array(std::string_view key) const;
  Expected<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Expected<std::vector<double>> get_float_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  static Expected<std::unique_ptr<GgufFile>> parse(std::unique_ptr<GgufFile> f);

  std::string path_;
  std::vector<uint8_t> owned_;        // from_bytes
  void* map_ = nullptr;               // open(): mmap base
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<TensorInfo> tensors_;
};

// Name of a ggml type ("Q4_1"), or "type N" for an unknown id.
std::string ggml_type_name(GgmlType t);
std::string ggml_type_name(uint32_t id);

// Says that bytes [p, p + n) of an open, mapped GGUF file (GgufFile::open) will not be
// read for a while: the whole pages inside the range leave this process's resident
// memory and are read from the file again if touched. Memory that is not inside a live
// file mapping (from_bytes, the heap) is left alone. A backend that keeps its own copy
// of a weight (the CPU backend's packed layout) calls it so the weight is not held twice.
void gguf_release_pages(const void* p, uint64_t n);

}  // namespace kvscope
