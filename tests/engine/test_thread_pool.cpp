// test_thread_pool.cpp — the CPU thread pool: every index covered once, a job wakes only the
// workers it has chunks for, a refused thread is an error (not an uncaught exception), and
// the backend clamps a thread count above the hardware with a notice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/thread_pool.h"

namespace kvscope {
namespace {

// Voluntary context switches of every thread of this process but the main one: a thread
// that sleeps and is woken adds one.
std::map<std::string, long> worker_switches() {
  std::map<std::string, long> out;
  const std::string self = std::to_string(getpid());
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    if (e.path().filename() == self) continue;
    std::ifstream f(e.path() / "status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0)
        out[e.path().filename()] = std::stol(line.substr(24));
  }
  return out;
}

// Waits until every thread of this process but the main one is asleep (state S in
// /proc/self/task/*/stat), up to 10 s: a fixed sleep can be too short on a busy machine.
bool workers_asleep() {
  const std::string self = std::to_string(getpid());
  for (int tries = 0; tries < 1000; ++tries) {
    bool all = true;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
      if (e.path().filename() == self) continue;
      std::ifstream f(e.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t paren = stat.rfind(')');  // "tid (name) STATE ..."
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'S')
        all = false;
    }
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(ThreadPool, EveryIndexOnceWithGrainAlignedChunks) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 3, 5, 31, 64, 1000}) {
    for (int64_t grain : {1, 3, 16}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(
          n,
          [&](int64_t b, int64_t e) {
            EXPECT_EQ(b % grain, 0) << "chunk start " << b << " grain " << grain;
            for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << n << " " << i;
    }
  }
}

// 1,000 threads turned a 0.44 s run into 41.5 s: every job woke every worker. Now a job
// with two chunks wakes one worker, however big the pool.
TEST(ThreadPool, AJobWakesOnlyTheWorkersItUses) {
  ThreadPool pool(16);
  ASSERT_EQ(pool.size(), 16) << pool.start_error();
  ASSERT_TRUE(workers_asleep()) << "the pool's workers did not go to sleep";
  const auto before_switches = worker_switches();
  const int jobs = 200;
  std::atomic<int64_t> sum{0};
  for (int j = 0; j < jobs; ++j) pool.parallel_for(2, [&](int64_t b, int64_t e) { sum += e - b; });
  const auto after_switches = worker_switches();
  EXPECT_EQ(sum.load(), 2 * jobs);
  EXPECT_EQ(pool.worker_wakeups(), uint64_t(jobs));  // was 15 per job
  // Seen from the kernel: the workers that went back to sleep again and again. One worker
  // has the second chunk of every job; the other 14 must not have been woken.
  int woken = 0;
  std::string detail;
  for (const auto& [tid, n] : after_switches) {
    const long delta = n - before_switches.at(tid);
    detail += tid + ":" + std::to_string(delta) + " ";
    if (delta >= jobs / 20) ++woken;
  }
  EXPECT_LE(woken, 1) << "voluntary context switches per worker: " << detail;

  // A job with chunks for everyone still reaches everyone.
  const uint64_t before = pool.worker_wakeups();
  pool.parallel_for(16, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(pool.worker_wakeups() - before, 15u);
}

TEST(ThreadPool, RefusedThreadIsAnErrorNotAnException) {
  int started = 0;
  auto spawn = [&](std::function<void()> fn) -> std::thread {
    if (started == 3)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    ++started;
    return std::thread(std::move(fn));
  };
  ThreadPool pool(8, spawn);
  EXPECT_EQ(pool.size(), 4);  // the caller and the three workers that started
  EXPECT_NE(pool.start_error().find("could not start CPU thread 5 of 8"), std::string::npos)
      << pool.start_error();
  // The threads that did start still work.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100);
}

TEST(CpuBackendThreads, ClampedToTheHardwareWithANotice) {
  const int hw = hardware_threads();
  std::string notice;
  auto b = create_cpu_backend(1000, &notice);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_NE((*b)->name().find("(" + std::to_string(hw) + " thread"), std::string::npos)
      << (*b)->name();
  EXPECT_EQ((*b)->threads(), hw);  // what a second backend like it is made with
  EXPECT_STREQ((*b)->kind(), "cpu");
  EXPECT_NE(notice.find("1000 CPU threads requested"), std::string::npos) << notice;
  EXPECT_NE(notice.find("using " + std::to_string(hw)), std::string::npos) << notice;

  notice.clear();
  auto one = create_cpu_backend(1, &notice);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(notice, "");
  EXPECT_NE((*one)->name().find("(1 thread"), std::string::npos) << (*one)->name();
  EXPECT_EQ((*one)->threads(), 1);
}

}  // namespace
}  // namespace kvscope
