// timing.h — time limits in tests that guard against a slow algorithm (a quadratic loop),
// not against a busy machine.
//
// thread_cpu_ms() is the calling thread's own CPU time, so other processes on a loaded
// machine do not count; only code that runs on the calling thread should be timed with it.
// Every limit is multiplied by kTimeLimitScale: 1 in a release build, 60 under a
// sanitizer (AddressSanitizer runs the code 30 to 60 times slower, ThreadSanitizer about
// as much), so the same test holds in every CI stage.
#pragma once

#include <time.h>

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

inline double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

}  // namespace kvscope::test
