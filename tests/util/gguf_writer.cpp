// gguf_writer.cpp — in-memory GGUF builder and round-to-nearest block quantizers for tests.
#include "tests/util/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "engine/quant.h"

namespace kvscope::test {
namespace {

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

template <class T>
std::vector<uint8_t> encode_array(GgufType elem, const std::vector<T>& v) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, static_cast<uint32_t>(elem));
  put<uint64_t>(out, v.size());
  for (const T& x : v) put<T>(out, x);
  return out;
}

template <class T>
std::vector<uint8_t> encode_scalar(T v) {
  std::vector<uint8_t> out;
  put<T>(out, v);
  return out;
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

void GgufWriter::set_alignment(uint32_t a) {
  alignment_ = a;
  add_u32("general.alignment", a);
}

void GgufWriter::add_raw(const std::string& key, GgufType type, const std::vector<uint8_t>& enc) {
  kvs_.push_back(Kv{key, static_cast<uint32_t>(type), enc});
}

void GgufWriter::add_u8(const std::string& k, uint8_t v) {
  add_raw(k, GgufType::U8, encode_scalar(v));
}
void GgufWriter::add_i8(const std::string& k, int8_t v) {
  add_raw(k, GgufType::I8, encode_scalar(v));
}
void GgufWriter::add_u16(const std::string& k, uint16_t v) {
  add_raw(k, GgufType::U16, encode_scalar(v));
}
void GgufWriter::add_i16(const std::string& k, int16_t v) {
  add_raw(k, GgufType::I16, encode_scalar(v));
}
void GgufWriter::add_u32(const std::string& k, uint32_t v) {
  add_raw(k, GgufType::U32, encode_scalar(v));
}
void GgufWriter::add_i32(const std::string& k, int32_t v) {
  add_raw(k, GgufType::I32, encode_scalar(v));
}
void GgufWriter::add_u64(const std::string& k, uint64_t v) {
  add_raw(k, GgufType::U64, encode_scalar(v));
}
void GgufWriter::add_i64(const std::string& k, int64_t v) {
  add_raw(k, GgufType::I64, encode_scalar(v));
}
void GgufWriter::add_f32(const std::string& k, float v) {
  add_raw(k, GgufType::F32, encode_scalar(v));
}
void GgufWriter::add_f64(const std::string& k, double v) {
  add_raw(k, GgufType::F64, encode_scalar(v));
}
void GgufWriter::add_bool(const std::string& k, bool v) {
  add_raw(k, GgufType::BOOL, encode_scalar<uint8_t>(v ? 1 : 0));
}
void GgufWriter::add_string(const std::string& k, const std::string& v) {
  std::vector<uint8_t> enc;
  put_string(enc, v);
  add_raw(k, GgufType::STRING, enc);
}

void GgufWriter::add_string_array(const std::string& k, const std::vector<std::string>& v) {
  std::vector<uint8_t> enc;
  put<uint32_t>(enc, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(enc, v.size());
  for (const std::string& s : v) put_string(enc, s);
  add_raw(k, GgufType::ARRAY, enc);
}
void GgufWriter::add_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::I32, v));
}
void GgufWriter::add_u32_array(const std::string& k, const std::vector<uint32_t>& v) {
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::U32, v));
}
void GgufWriter::add_i64_array(const std::string& k, const std::vector<int64_t>& v) {
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::I64, v));
}
void GgufWriter::add_u8_array(const std::string& k, const std::vector<uint8_t>& v) {
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::U8, v));
}
void GgufWriter::add_f32_array(const std::string& k, const std::vector<float>& v) {
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::F32, v));
}
void GgufWriter::add_f64_array(const std::string& k, const std::vector<double>& v) {
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::F64, v));
}
void GgufWriter::add_bool_array(const std::string& k, const std::vector<bool>& v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  add_raw(k, GgufType::ARRAY, encode_array(GgufType::BOOL, bytes));
}

void GgufWriter::add_tensor(const std::string& name, const std::vector<uint64_t>& ne, GgmlType type,
                            std::vector<uint8_t> data) {
  add_tensor_raw(name, ne, static_cast<uint32_t>(type), std::move(data));
}

void GgufWriter::add_tensor_raw(const std::string& name, const std::vector<uint64_t>& ne,
                                uint32_t type_id, std::vector<uint8_t> data) {
  tensors_.push_back(Tensor{name, ne, type_id, std::move(data)});
}

void GgufWriter::add_tensor_f32(const std::string& name, const std::vector<uint64_t>& ne,
                                const std::vector<float>& values) {
  std::vector<uint8_t> data(values.size() * 4);
  std::memcpy(data.data(), values.data(), data.size());
  add_tensor(name, ne, GgmlType::F32, std::move(data));
}

std::vector<uint8_t> GgufWriter::build(GgufLayout* layout) const {
  GgufLayout lay;
  const uint64_t al = alignment_ ? alignment_ : 32;
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), "GGUF", 4);
  put<uint32_t>(out, version_);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kvs_.size());
  for (const Kv& kv : kvs_) {
    lay.kv_offsets.push_back(out.size());
    put_string(out, kv.key);
    put<uint32_t>(out, kv.type);
    out.insert(out.end(), kv.encoded.begin(), kv.encoded.end());
  }
  uint64_t rel = 0;
  std::vector<uint64_t> rel_offsets;
  for (const Tensor& t : tensors_) {
    GgufLayout::TensorFields f;
    f.info = out.size();
    put_string(out, t.name);
    f.n_dims = out.size();
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    f.ne0 = out.size();
    for (uint64_t d : t.ne) put<uint64_t>(out, d);
    f.type = out.size();
    put<uint32_t>(out, t.type_id);
    f.offset = out.size();
    put<uint64_t>(out, rel);
    rel_offsets.push_back(rel);
    rel = align_up(rel + t.data.size(), al);
    lay.tensor_fields.push_back(f);
  }
  if (!tensors_.empty()) {
    lay.data_start = align_up(out.size(), al);
    out.resize(lay.data_start, 0);
    for (size_t k = 0; k < tensors_.size(); ++k) {
      const uint64_t at = lay.data_start + rel_offsets[k];
      lay.tensor_data.push_back(at);
      out.resize(at, 0);
      out.insert(out.end(), tensors_[k].data.begin(), tensors_[k].data.end());
    }
  } else {
    lay.data_start = out.size();
  }
  if (layout) *layout = std::move(lay);
  return out;
}

Status GgufWriter::write(const std::string& path) const {
  const std::vector<uint8_t> bytes = build();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return make_error("gguf_writer: cannot create ", path);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) return make_error("gguf_writer: cannot write ", bytes.size(), " bytes to ", path);
  return Status::Ok();
}

void quantize_block_q8_0(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const uint16_t dh = fp32_to_fp16(amax / 127.0f);
  const float d = fp16_to_fp32(dh);
  std::memcpy(out, &dh, 2);
  for (int j = 0; j < 32; ++j) {
    const float q = d > 0.0f ? std::round(x[j] / d) : 0.0f;
    out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
  }
}

void quantize_block_q4_0(const float* x, uint8_t* out) {
  float mx = 0.0f;  // the value with the largest magnitude, sign kept
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > std::fabs(mx)) mx = x[j];
  }
  const uint16_t dh = fp32_to_fp16(mx / -8.0f);
  const float d = fp16_to_fp32(dh);
  std::memcpy(out, &dh, 2);
  auto q = [&](float v) {
    const float r = d != 0.0f ? std::round(v / d) + 8.0f : 8.0f;
    return static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
  };
  for (int j = 0; j < 16; ++j) out[2 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + 16]) << 4));
}

void quantize_block_q4_1(const float* x, uint8_t* out) {
  float mn = x[0], mx = x[0];
  for (int j = 1; j < 32; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const uint16_t dh = fp32_to_fp16((mx - mn) / 15.0f);
  const uint16_t mh = fp32_to_fp16(mn);
  const float d = fp16_to_fp32(dh), m = fp16_to_fp32(mh);
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &mh, 2);
  auto q = [&](float v) {
    const float r = d > 0.0f ? std::round((v - m) / d) : 0.0f;
    return static_cast<uint8_t>(std::clamp(r, 0.0f, 15.0f));
  };
  // Low nibble of byte j is value j; the high nibble is value j + 16.
  for (int j = 0; j < 16; ++j) out[4 + j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + 16]) << 4));
}

std::vector<uint8_t> quantize_rows(GgmlType type, const std::vector<float>& values,
                                   uint64_t n_per_row) {
  const uint64_t n = values.size();
  std::vector<uint8_t> out;
  switch (type) {
    case GgmlType::F32:
      out.resize(n * 4);
      std::memcpy(out.data(), values.data(), out.size());
      return out;
    case GgmlType::F16:
    case GgmlType::BF16:
      out.resize(n * 2);
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        if (type == GgmlType::F16) {
          h = fp32_to_fp16(values[i]);
        } else {
          uint32_t bits;
          std::memcpy(&bits, &values[i], 4);
          h = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
        }
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      return out;
    default:
      break;
  }
  void (*block)(const float*, uint8_t*) = nullptr;
  if (type == GgmlType::Q8_0) block = quantize_block_q8_0;
  if (type == GgmlType::Q4_0) block = quantize_block_q4_0;
  if (type == GgmlType::Q4_1) block = quantize_block_q4_1;
  const TypeTraits* tt = type_traits(type);
  if (!block || !tt || n_per_row == 0 || n_per_row % 32 != 0 || n % n_per_row != 0) return {};
  out.resize(n / 32 * tt->type_size);
  for (uint64_t b = 0; b < n / 32; ++b)
    block(values.data() + 32 * b, out.data() + b * tt->type_size);
  return out;
}

}  // namespace kvscope::test
