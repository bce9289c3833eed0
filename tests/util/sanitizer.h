// sanitizer.h — whether this test binary is built with AddressSanitizer, so a long
// real-model test can run a shorter version of itself there (an ASan run costs 30 to 60
// times a release run; the code it covers is the same, and the release stage runs the
// full length). scripts/test.sh says which tests do.
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
