// weight_arena.cpp — see weight_arena.h.
#include "engine/cpu/weight_arena.h"

#include <algorithm>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvscope::cpu {

namespace {
uint64_t round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

WeightArena::WeightArena(uint64_t max_chunk_bytes)
    : max_chunk_bytes_(round_up(max_chunk_bytes == 0 ? kHugePage : max_chunk_bytes, kHugePage)) {}

WeightArena::~WeightArena() {
  for (Chunk& c : chunks_) std::free(c.base);
}

uint8_t* WeightArena::allocate(uint64_t n) {
  n = round_up(n == 0 ? 1 : n, 64);
  for (Chunk& c : chunks_)
    if (c.size - c.used >= n) {
      uint8_t* p = c.base + c.used;
      c.used += n;
      return p;
    }
  Chunk c;
  const uint64_t next = next_chunk_bytes_;  // never above max_chunk_bytes_
  c.size = n > next ? round_up(n, kHugePage) : next;
  c.base = static_cast<uint8_t*>(std::aligned_alloc(kHugePage, c.size));
  if (!c.base) return nullptr;
#if defined(MADV_HUGEPAGE)
  // A request, not a requirement: without transparent huge pages the chunk keeps 4 KiB
  // pages and everything works the same.
  madvise(c.base, c.size, MADV_HUGEPAGE);
#endif
  c.used = n;
  chunks_.push_back(c);
  next_chunk_bytes_ = std::min(next * 2, max_chunk_bytes_);
  return c.base;
}

uint64_t WeightArena::reserved_bytes() const {
  uint64_t total = 0;
  for (const Chunk& c : chunks_) total += c.size;
  return total;
}

}  // namespace kvscope::cpu
