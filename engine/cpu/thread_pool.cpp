// thread_pool.cpp — see thread_pool.h.
#include "engine/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define KV_CPU_RELAX() _mm_pause()
#else
#define KV_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvscope {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t units = (n + grain - 1) / grain;
  int parts = int(std::min<int64_t>(n_threads_, units));
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  int64_t chunk = (units + parts - 1) / parts * grain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_.store(n_threads_ - 1);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
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
  uint64_t seen = 0;
  for (;;) {
    // Spin for a short while (cheap hand-off between the many small loops of a step),
    // then sleep until the next job.
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      KV_CPU_RELAX();
      if (++spins % 256 == 0) std::this_thread::yield();
      if (spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    const auto* fn = job_;
    int64_t begin = int64_t(index) * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
    if (begin < end) (*fn)(begin, end);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kvscope
