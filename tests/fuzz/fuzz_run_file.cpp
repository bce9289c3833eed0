// fuzz_run_file.cpp — libFuzzer entry point for the run-file loader (app/run_file.h).
//
// Each input is validated twice: as is (checksums verified: almost every mutation must be
// refused there, cleanly), and with checksums ignored, which lets mutated payloads reach the
// META/STEP/END decoders. Whenever the index accepts a file, every step it lists must decode:
// the index and the step reader must agree. A violation aborts so the fuzzer keeps the input.
// Seeds: tests/fuzz/corpus/run_file/ (small real recordings of a tiny model).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "app/core/run_file.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_run_file: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check(const kvscope::app::ByteSource& src, bool verify_crc) {
  auto idx = kvscope::app::index_run(src, "input", verify_crc);
  if (!idx.ok()) {
    if (idx.error().message.empty()) fail("an empty error message", "");
    return;
  }
  if (idx->end.steps != int(idx->steps.size())) fail("END count disagrees with the index", "");
  for (uint64_t off : idx->steps) {
    auto t = kvscope::app::read_step_record(src, off, "input", verify_crc);
    if (!t.ok()) fail("an indexed step does not decode", t.error().message);
    const size_t want = size_t(t->n_layer) * size_t(t->n_head) * size_t(t->n_attn);
    if (!t->attention.empty() && t->attention.size() != want)
      fail("attention size disagrees with its shape", std::to_string(t->attention.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvscope::app::BufferSource src(data, size);
  check(src, /*verify_crc=*/true);
  check(src, /*verify_crc=*/false);
  return 0;
}
