// thread_pool.cpp — see thread_pool.h.
#include "engine/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <exception>

#if defined(__x86_64__)
#include <immintrin.h>
#define KV_CPU_RELAX() _mm_pause()
#else
#define KV_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvscope {

int hardware_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int n_threads)
    : ThreadPool(n_threads, [](std::function<void()> fn) { return std::thread(std::move(fn)); }) {}

ThreadPool::ThreadPool(int n_threads, const Spawn& spawn)
    : n_threads_(std::max(1, n_threads)), slots_(new Slot[size_t(std::max(1, n_threads))]) {
  const int wanted = n_threads_;
  for (int i = 1; i < wanted; ++i) {
    try {
      threads_.push_back(spawn([this, i] { worker(i); }));
    } catch (const std::exception& e) {
      start_error_ = "could not start CPU thread " + std::to_string(i + 1) + " of " +
                     std::to_string(wanted) + " (" + e.what() + ")";
      n_threads_ = i;  // the threads started so far, the caller included
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  for (size_t i = 0; i < threads_.size(); ++i) {
    Slot& s = slots_[i + 1];
    s.generation.fetch_add(1, std::memory_order_release);
    s.generation.notify_one();
  }
  for (auto& t : threads_) t.join();
}

uint64_t ThreadPool::worker_wakeups() const {
  uint64_t n = 0;
  for (size_t i = 0; i < threads_.size(); ++i)
    n += slots_[i + 1].wakeups.load(std::memory_order_relaxed);
  return n;
}

void ThreadPool::parallel_for(int64_t n, RangeFn fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int parts = int(std::min<int64_t>(n_threads_, units));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  // A few chunks per thread, claimed in order by whoever is free: when the system runs
  // a thread late (other programs share the cores), the others take its chunks.
  const int64_t want = std::min<int64_t>({units, int64_t(parts) * kChunksPerThread, kMaxChunks});
  const int64_t chunk = (units + want - 1) / want * grain;
  const int64_t total = (n + chunk - 1) / chunk;
  const int wake = int(std::min<int64_t>(parts, total)) - 1;
  job_ = fn;
  job_n_ = n;
  job_chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  epoch_ = (epoch_ + 1) & 0xFFFFFFFFu;
  claim_.store(epoch_ << 32 | uint64_t(total) << 16, std::memory_order_release);
  // Only the workers that can have a chunk are woken (notify is a no-op for a spinning
  // worker).
  for (int i = 1; i <= wake; ++i) {
    slots_[i].wakeups.fetch_add(1, std::memory_order_relaxed);
    slots_[i].generation.fetch_add(1, std::memory_order_release);
    slots_[i].generation.notify_one();
  }
  run_chunks();
  // Every chunk is claimed; wait for the ones a worker is still running. Spin briefly,
  // then yield: on a loaded machine that worker may be waiting for a core.
  for (int spins = 0; done_.load(std::memory_order_acquire) != total; ++spins) {
    if (spins < 4096) {
      KV_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

// Claims and runs chunks of the job in progress until none is left. The claim word holds
// the job's epoch, its chunk count and the next chunk, so a worker that arrives after its
// job ended claims nothing (the epoch has moved on) and never reads a later job's fields
// before its claim succeeds.
void ThreadPool::run_chunks() {
  uint64_t c = claim_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = c & 0xFFFF, total = (c >> 16) & 0xFFFF;
    if (next >= total) return;
    if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;
    const int64_t begin = int64_t(next) * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
    job_(begin, end);
    done_.fetch_add(1, std::memory_order_acq_rel);
    c = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker(int index) {
  Slot& slot = slots_[index];
  uint32_t seen = 0;
  for (;;) {
    // Spin for a short while (cheap hand-off between the many small loops of a step),
    // then sleep until this worker's next job.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    uint32_t gen;
    for (int spins = 1; (gen = slot.generation.load(std::memory_order_acquire)) == seen; ++spins) {
      KV_CPU_RELAX();
      if (spins % 256 == 0) {
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() > spin_until)
          slot.generation.wait(seen, std::memory_order_acquire);
      }
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    run_chunks();
  }
}

}  // namespace kvscope
