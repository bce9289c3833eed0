// fuzz_run_file.cpp — libFuzzer entry point for the run-file loader (app/run_file.h).
//
// Each input is validated twice: as is (checksums verified: almost every mutation must be
// refused there, cleanly), and with checksums ignored, which lets mutated payloads reach the
// META/STEP/END decoders. Whenever the index accepts a file, every step it lists must decode:
// the index and the step reader must agree. The same for the serving reader
// (serving_record.h): whenever it opens a file, every snapshot must rebuild, and never both
// readers accept one file. A violation aborts so the fuzzer keeps the input.
// Seeds: tests/fuzz/corpus/run_file/ (small real recordings of a tiny model, and a small
// hand-made serving run).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "app/core/run_file.h"
#include "app/core/serving_record.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_run_file: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Returns whether the serving reader accepted the input.
bool check_serving(const uint8_t* data, size_t size, bool verify_crc) {
  using namespace kvscope::app;
  auto rp = ServingReplay::open(std::make_unique<BufferSource>(data, size), "input", verify_crc);
  if (!rp.ok()) {
    if (rp.error().message.empty()) fail("an empty serving error message", "");
    return false;
  }
  ServingReplay& r = *rp.value();
  // Backward from the newest (checkpoints), then forward one at a time.
  for (int i : {r.steps() - 1, 0})
    if (i >= 0 && !r.snapshot(i).ok()) fail("an indexed snapshot does not rebuild", "");
  for (int i = 0; i < r.steps(); ++i) {
    auto s = r.snapshot(i);
    if (!s.ok()) fail("an indexed snapshot does not rebuild", s.error().message);
    if (int64_t(s.value()->tiles.size()) > kServingFileMaxBlocks) fail("too many tiles", "");
  }
  return true;
}

void check(const kvscope::app::ByteSource& src, const uint8_t* data, size_t size, bool verify_crc) {
  const bool serving = check_serving(data, size, verify_crc);
  auto idx = kvscope::app::index_run(src, "input", verify_crc);
  if (idx.ok() && serving) fail("both readers accept the input", "");
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
  check(src, data, size, /*verify_crc=*/true);
  check(src, data, size, /*verify_crc=*/false);
  return 0;
}
