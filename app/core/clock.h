// clock.h — the one clock the app stamps its events with: seconds on the steady clock
// (monotonic; only differences between two stamps mean anything).
#pragma once

#include <chrono>
#include <cstdint>

namespace kvscope::app {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The same clock in milliseconds, for the benchmarks' timings.
inline double now_ms() {
  return now_s() * 1e3;
}

// The same clock in whole nanoseconds, for a stamp kept in a std::atomic<int64_t>.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace kvscope::app
