// sanitizer.h — whether this test binary is built with AddressSanitizer, so a long
// real-model test can run a shorter version of itself there (with the SIMD kernels
// uninstrumented there a real-model test takes about 1.7 times its release time, 10 to 20
// times before; the code it covers is the same, and the release stage runs the full
// length). scripts/test.sh says which tests do.
#pragma once

namespace kvscope::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace kvscope::test
