// fuzz_model.cpp — fuzz target for the path from a model file to the first forward step:
// Model::load (GGUF parse, metadata and shape checks, weight views, tokenizer) and then, for
// a file that loads, the CPU backend, Session::create, reset with a short prompt and one
// step (prefill + sampling) in each cache mode.
//
// Any input must either be rejected with an error or produce a step whose token is inside
// the vocabulary; anything else (a crash, an AddressSanitizer report, a violated
// invariant) is a finding. Model::load takes a path, so each input is written to an
// in-memory file (memfd) and opened through /proc/self/fd: the real loading path, mmap
// included. Inputs that declare large tensors are bounded by the input size (every
// tensor's bytes lie inside the file), so one step stays cheap.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/cpu/cpu_backend.h"
#include "engine/model.h"
#include "engine/session.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_model: %s %s\n", what, detail.c_str());
  std::abort();
}

// Writes the input to an anonymous in-memory file; returns its /proc path (or "").
std::string memory_file(const uint8_t* data, size_t size, int* fd_out) {
  const int fd = memfd_create("fuzz_model.gguf", MFD_CLOEXEC);
  if (fd < 0) return {};
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) {
      close(fd);
      return {};
    }
    done += size_t(n);
  }
  *fd_out = fd;
  return "/proc/self/fd/" + std::to_string(fd);
}

void one_step(const std::shared_ptr<kvscope::Model>& model, kvscope::CacheMode mode) {
  kvscope::SessionConfig cfg;
  cfg.mode = mode;
  cfg.max_tokens = 2;
  auto session = kvscope::Session::create(model, kvscope::make_cpu_backend(1), cfg);
  if (!session.ok()) fail("Session::create failed:", session.error().message);
  kvscope::Session& s = **session;
  if (!s.reset({"Hi there", false, false}).ok()) return;  // e.g. a context of 2 tokens
  auto tr = s.step();
  if (!tr.ok()) {
    if (tr.error().message.empty()) fail("a step failed without a message");
    return;
  }
  const int V = model->config().n_vocab;
  if (tr->token_id < 0 || tr->token_id >= V) fail("sampled token outside the vocabulary");
  if (tr->top.empty()) fail("no candidates");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fd = -1;
  const std::string path = memory_file(data, size, &fd);
  if (path.empty()) return 0;
  auto model = kvscope::Model::load(path);
  close(fd);  // the model keeps its mapping
  if (!model.ok()) {
    if (model.error().message.empty()) fail("a rejection without a message");
    return 0;
  }
  one_step(*model, kvscope::CacheMode::Cache);
  one_step(*model, kvscope::CacheMode::NoCache);
  return 0;
}
