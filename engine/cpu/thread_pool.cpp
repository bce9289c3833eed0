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

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int parts = int(std::min<int64_t>(n_threads_, units));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (units + parts - 1) / parts * grain;
  const int used = int((n + chunk - 1) / chunk);  // chunks that are not empty, <= parts
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  pending_.store(used - 1, std::memory_order_relaxed);
  // Only the workers with a chunk are woken (notify is a no-op for a spinning worker).
  for (int i = 1; i < used; ++i) {
    slots_[i].generation.fetch_add(1, std::memory_order_release);
    slots_[i].generation.notify_one();
  }
  fn(0, std::min(n, chunk));
  // Spin briefly, then yield: on a loaded machine a worker may be waiting for a core.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096) {
      KV_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
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
    slot.wakeups.fetch_add(1, std::memory_order_relaxed);
    const int64_t begin = int64_t(index) * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
    if (begin < end) (*job_)(begin, end);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kvscope
