// weight_arena.h — the memory the CPU backend's packed weights live in: a few large
// chunks, each aligned to 2 MiB and marked for transparent huge pages, instead of one
// allocation per matrix.
//
// A decode step reads every weight once (98 MB for the default model). In 4 KiB pages
// that is about 24,000 pages a step, each a TLB miss and a page walk; in 2 MiB pages, 50.
// Where the kernel gives huge pages only on request (transparent_hugepage = madvise, the
// default on many distributions), per-matrix allocations never get them: each is its own
// mapping of 0.2 to 30 MB, rarely holding an aligned 2 MiB stretch. Decode tg128 gained
// about 5% (median of six alternating rounds, on 1 and on 2 threads; Intel Xeon, Emerald
// Rapids, AVX-512); docs/performance.md has the figures and their noise.
//
// Not thread-safe (the backend packs on its calling thread). Chunks are freed with the
// arena; until then the memory of a weight stays reserved. The default model's packed
// weights take six chunks, 2 to 32 MiB, about 2% more than the weights themselves.
#pragma once

#include <cstdint>
#include <vector>

namespace kvscope::cpu {

class WeightArena {
 public:
  // Chunks of 2 MiB, then each twice the one before up to max_chunk_bytes: a small model
  // reserves little (a chunk is counted whole by a sanitizer's heap count, though only
  // its touched pages are resident). A request larger than the next chunk gets a chunk
  // of its own, in whole huge pages.
  explicit WeightArena(uint64_t max_chunk_bytes = uint64_t(32) << 20);
  ~WeightArena();
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;

  // n bytes, 64-byte aligned, valid for the arena's lifetime; nullptr when out of memory.
  uint8_t* allocate(uint64_t n);
  // Bytes of all chunks (reserved address space; only touched pages are resident).
  uint64_t reserved_bytes() const;

  static constexpr uint64_t kHugePage = uint64_t(2) << 20;

 private:
  struct Chunk {
    uint8_t* base = nullptr;
    uint64_t size = 0, used = 0;
  };
  uint64_t max_chunk_bytes_;
  uint64_t next_chunk_bytes_ = kHugePage;
  std::vector<Chunk> chunks_;
};

}  // namespace kvscope::cpu
