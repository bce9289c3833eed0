// timing.h — time limits in tests that guard against a slow algorithm (a quadratic loop),
// not against a busy machine.
//
// thread_cpu_ms() is the calling thread's own CPU time, so other processes on a loaded
// machine do not count; only code that runs on the calling thread should be timed with it.
// Every limit is multiplied by time_limit_scale(): kTimeLimitScale (1 in a release build, 60
// under a sanitizer: AddressSanitizer runs the code 30 to 60 times slower, ThreadSanitizer
// about as much), so the same test holds in every CI stage, times the environment variable
// KVSCOPE_TEST_TIME_SCALE (default 1) for a machine slower than the 2-core CI machine the
// limits were set on. CPU time does not count other processes' time, but cache and memory
// contention and a lower clock under load still slow a thread; the limits leave 10x or more
// for that. Latency and pacing are tested by what ran and in which order, not by time.
#pragma once

#include <time.h>

#include <cstdlib>

#include "tests/util/sanitizer.h"

namespace kvscope::test {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif

inline constexpr double kTimeLimitScale = (kAddressSanitizer || kThreadSanitizer) ? 60.0 : 1.0;

inline double time_limit_scale() {
  double scale = kTimeLimitScale;
  if (const char* env = std::getenv("KVSCOPE_TEST_TIME_SCALE")) {
    const double f = std::strtod(env, nullptr);
    if (f > 0) scale *= f;
  }
  return scale;
}

inline double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

}  // namespace kvscope::test
