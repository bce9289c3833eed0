// thread_pool.h — a small persistent pool for data-parallel loops.
//
// parallel_for(n, fn) splits [0, n) into contiguous chunks, one per thread, and calls
// fn(begin, end) on each; the calling thread takes the first chunk. Workers spin
// briefly between jobs (a decode step issues hundreds of short loops) and then sleep.
// One job at a time: parallel_for must not be called from inside fn or from two
// threads at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvscope {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Calls fn(begin, end) over a partition of [0, n) into at most size() chunks whose
  // boundaries are multiples of `grain` (except the last).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t grain = 1);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace kvscope
