// thread_pool.h — a small persistent pool for data-parallel loops.
//
// parallel_for(n, fn) splits [0, n) into contiguous chunks, a few per thread, and calls
// fn(begin, end) on each; the calling thread and the workers claim chunks in order until
// none is left, so a thread the system runs late (other programs on the same cores)
// leaves its share to the others instead of holding the whole job up. A job wakes only
// the workers it has chunks for: each worker waits on its own generation word, so a short
// loop on a big pool costs what it uses. Workers spin briefly between jobs (a decode step
// issues hundreds of short loops) and then sleep on that word (a futex, no lock).
// Which thread runs a chunk varies from run to run: fn must give the same results
// whichever thread runs a chunk (every caller writes each output from one chunk only).
// One job at a time: parallel_for must not be called from inside fn or from two threads
// at once.
//
// The constructor never throws: when the system refuses a thread, the pool keeps the
// threads it has (size() says how many) and start_error() says what failed, so callers
// can report it as an error instead of an uncaught std::system_error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvscope {

// Threads this process may run on at once (its CPU affinity set; at least 1).
int hardware_threads();

// A non-owning reference to a callable fn(begin, end), valid while the callable lives
// (parallel_for returns before its argument's full expression ends). Unlike a
// std::function, making one never allocates: a decode step hands the pool a few hundred
// jobs whose lambdas capture more than a std::function stores in place.
class RangeFn {
 public:
  RangeFn() = default;  // calls nothing; only for a pool with no job yet
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT(google-explicit-constructor): call sites pass lambdas
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, int64_t b, int64_t e) {
          (*static_cast<std::remove_reference_t<F>*>(o))(b, e);
        }) {}
  void operator()(int64_t begin, int64_t end) const { call_(obj_, begin, end); }

 private:
  void* obj_ = nullptr;
  void (*call_)(void*, int64_t, int64_t) = nullptr;
};

class ThreadPool {
 public:
  // Starts a thread; throws std::system_error when the system refuses (tests replace it).
  using Spawn = std::function<std::thread(std::function<void()>)>;

  explicit ThreadPool(int n_threads);
  ThreadPool(int n_threads, const Spawn& spawn);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that take part in a job, the caller included (>= 1).
  int size() const { return n_threads_; }
  // Empty, or why fewer threads than requested were started.
  const std::string& start_error() const { return start_error_; }
  // Calls fn(begin, end) over a partition of [0, n) into at most 4 · size() chunks whose
  // boundaries are multiples of `grain` (except the last).
  void parallel_for(int64_t n, RangeFn fn, int64_t grain = 1);
  // Jobs that have signalled a worker since construction (the caller not counted):
  // one per worker a job used.
  uint64_t worker_wakeups() const;

 private:
  // One per worker, on its own cache line: the job generation it waits on.
  struct alignas(64) Slot {
    std::atomic<uint32_t> generation{0};
    std::atomic<uint64_t> wakeups{0};
  };
  void worker(int index);

  int n_threads_ = 1;
  std::string start_error_;
  std::unique_ptr<Slot[]> slots_;  // [n_threads_]; slot 0 (the caller) unused
  std::vector<std::thread> threads_;
  static constexpr int64_t kChunksPerThread = 4, kMaxChunks = 0xFFFF;
  void run_chunks();
  // The job in progress: written by the caller before it publishes claim_, read by a
  // worker only after it has claimed a chunk of that job.
  RangeFn job_;
  int64_t job_n_ = 0, job_chunk_ = 0;
  uint64_t epoch_ = 0;
  // epoch << 32 | chunks << 16 | next chunk to claim.
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<int64_t> done_{0};  // chunks finished
  std::atomic<bool> stop_{false};
};

}  // namespace kvscope
