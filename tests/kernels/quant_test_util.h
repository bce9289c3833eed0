// quant_test_util.h — random quantized matrices for the kernel tests: host bytes in any
// type the kernels decode, their CPU dequantization (the engine's reference) and the
// QMatrix view of a device copy.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "engine/quant.h"
#include "kernels/kernels.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/util/gguf_writer.h"

namespace kvscope::test {

using kvscope::GgmlType;

struct HostMatrix {
  GgmlType type;
  int64_t n_in, n_out;
  std::vector<uint8_t> bytes;
  int64_t row_bytes() const { return int64_t(kvscope::row_bytes(type, uint64_t(n_in))); }
  std::vector<float> dequant() const {
    std::vector<float> out(size_t(n_in * n_out));
    for (int64_t r = 0; r < n_out; ++r)
      kvscope::dequantize_row(type, bytes.data() + r * row_bytes(), out.data() + r * n_in, n_in);
    return out;
  }
};

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = kvscope::fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random matrix of any supported type: quantized from random values where the test
// writer can, else random block bytes with sane fp16 scales patched in.
inline HostMatrix random_matrix(GgmlType type, int64_t n_in, int64_t n_out, uint32_t seed) {
  HostMatrix m{type, n_in, n_out, {}};
  switch (type) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0:
    case GgmlType::Q4_0: case GgmlType::Q4_1:
      m.bytes = kvscope::test::quantize_rows(type, random_floats(size_t(n_in * n_out), seed),
                                             uint64_t(n_in));
      return m;
    default: break;
  }
  m.bytes.resize(size_t(m.row_bytes() * n_out));
  std::mt19937 rng(seed);
  for (auto& b : m.bytes) b = uint8_t(rng());
  const auto* tr = kvscope::type_traits(type);
  for (size_t off = 0; off < m.bytes.size(); off += tr->type_size) {
    uint8_t* b = m.bytes.data() + off;
    const float d = 0.01f + float(rng() % 100) / 1000.f, mn = float(rng() % 100) / 500.f;
    if (type == GgmlType::Q6_K) {
      put_f16(b + 208, d);
    } else {
      put_f16(b, d);
      if (type != GgmlType::Q5_0) put_f16(b + 2, mn);
    }
  }
  return m;
}

inline kvscope::cuda::QMatrix qmatrix(const HostMatrix& h, const void* dev) {
  return kvscope::cuda::QMatrix{dev, kvscope::cuda::QType(int(h.type)), h.n_in, h.n_out, h.row_bytes()};
}

}  // namespace kvscope::test
