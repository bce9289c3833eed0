// gguf_writer.h — builds GGUF files in memory for tests, fuzz seeds and tiny models.
//
// Usage:
//   kvscope::test::GgufWriter w;
//   w.add_string("general.architecture", "llama");
//   w.add_u32("llama.block_count", 2);
//   w.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
//   w.add_tensor_f32("output_norm.weight", {64}, norm_values);
//   w.add_tensor("token_embd.weight", {64, 100}, GgmlType::Q8_0,
//                quantize_rows(GgmlType::Q8_0, embd_values, 64));
//   std::vector<uint8_t> bytes = w.build();          // or w.write(path)
//
// Keys and tensors are written in the order they were added. Tensor data is laid out
// back to back, each tensor padded to the alignment (32, or what set_alignment chose).
// The writer does not validate: it writes what it is told (shapes that disagree with the
// byte count, unknown type ids, duplicate names), which is what corruption tests need.
// build(&layout) reports where each field landed so a test can patch single bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/gguf.h"
#include "common/status.h"

namespace kvscope::test {

// Byte offsets of the fields of a built file (for corruption tests).
struct GgufLayout {
  uint64_t version_offset = 4;
  uint64_t tensor_count_offset = 8;
  uint64_t kv_count_offset = 16;
  std::vector<uint64_t> kv_offsets;  // start of each key (its u64 length)
  // Per tensor, in add order: where its info starts (name length) and where its n_dims,
  // ne[0], type and offset fields are.
  struct TensorFields {
    uint64_t info = 0, n_dims = 0, ne0 = 0, type = 0, offset = 0;
  };
  std::vector<TensorFields> tensor_fields;
  uint64_t data_start = 0;            // absolute offset of the data section
  std::vector<uint64_t> tensor_data;  // absolute offset of each tensor's data
};

class GgufWriter {
 public:
  // GGUF version written in the header (default 3).
  void set_version(uint32_t v) { version_ = v; }
  // Writes general.alignment (u32) and pads the data section and each tensor to it.
  void set_alignment(uint32_t a);

  // Scalars.
  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f32(const std::string& key, float v);
  void add_f64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);

  // Arrays.
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_u32_array(const std::string& key, const std::vector<uint32_t>& v);
  void add_i64_array(const std::string& key, const std::vector<int64_t>& v);
  void add_u8_array(const std::string& key, const std::vector<uint8_t>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_f64_array(const std::string& key, const std::vector<double>& v);
  void add_bool_array(const std::string& key, const std::vector<bool>& v);
  // Any value: the u32 value type followed by `encoded` (already little-endian bytes).
  void add_raw(const std::string& key, GgufType type, const std::vector<uint8_t>& encoded);

  // A tensor: ne[0] is the row length. `data` is written as is.
  void add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                  std::vector<uint8_t> data);
  // Same with a raw type id (to write ids the reader does not know).
  void add_tensor_raw(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type_id,
                      std::vector<uint8_t> data);
  void add_tensor_f32(const std::string& name, const std::vector<uint64_t>& ne,
                      const std::vector<float>& values);

  std::vector<uint8_t> build(GgufLayout* layout = nullptr) const;
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type_id;
    std::vector<uint8_t> data;
  };
  struct Kv {
    std::string key;
    uint32_t type;
    std::vector<uint8_t> encoded;
  };
  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

// Quantizes `values` (rows of n_per_row values, back to back) into `type` with simple
// round-to-nearest per block. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1. n_per_row must
// be a multiple of the block size and values.size() a multiple of n_per_row.
std::vector<uint8_t> quantize_rows(GgmlType type, const std::vector<float>& values,
                                   uint64_t n_per_row);
// One block of 32 values each.
void quantize_block_q8_0(const float* x, uint8_t* out);  // 34 bytes
void quantize_block_q4_0(const float* x, uint8_t* out);  // 18 bytes
void quantize_block_q4_1(const float* x, uint8_t* out);  // 20 bytes

}  // namespace kvscope::test
