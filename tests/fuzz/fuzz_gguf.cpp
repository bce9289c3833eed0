// fuzz_gguf.cpp — fuzz target for the GGUF reader (GgufFile::from_bytes).
//
// Any input must either be rejected with an error or open into a file whose tensors all
// point at readable bytes inside the input; the target then reads every tensor's first and
// last byte, dequantizes the first row of small supported tensors and calls every getter,
// so a bad bounds check shows up as a crash (or an AddressSanitizer report).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/gguf.h"
#include "engine/quant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  auto opened = kvscope::GgufFile::from_bytes(std::move(bytes), "fuzz.gguf");
  if (!opened.ok()) {
    // Every rejection must explain itself.
    if (opened.error().message.empty()) __builtin_trap();
    return 0;
  }
  const kvscope::GgufFile& f = **opened;
  volatile uint32_t sink = 0;
  for (const auto& [key, value] : f.metadata()) {
    (void)f.get_string(key);
    (void)f.get_int(key);
    (void)f.get_float(key);
    (void)f.get_bool(key);
    (void)f.get_string_array(key);
    (void)f.get_int_array(key);
    (void)f.get_float_array(key);
    if (f.find(key) != &value) __builtin_trap();  // duplicate keys must have been rejected
  }
  std::vector<float> row;
  for (const kvscope::TensorInfo& t : f.tensors()) {
    if (t.nbytes == 0 || t.data == nullptr) __builtin_trap();
    sink = sink + t.data[0] + t.data[t.nbytes - 1];
    if (f.find_tensor(t.name) != &t) __builtin_trap();
    const uint64_t n = t.ne[0];
    if (kvscope::type_supported(t.type) && n <= (1u << 14)) {
      row.resize(n);
      kvscope::dequantize_row(t.type, t.data, row.data(), static_cast<int64_t>(n));
      (void)kvscope::vec_dot(t.type, t.data, row.data(), static_cast<int64_t>(n));
    }
  }
  (void)sink;
  return 0;
}
