// emu_sanitizer.h — the AddressSanitizer hooks the emulator needs, as no-ops elsewhere.
//
// Fiber switches must be announced to ASan (it tracks one stack per OS thread otherwise),
// and device allocations poison the bytes past their requested size so that a kernel
// overrunning a buffer by a single byte is reported at the faulting access.
#pragma once

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define KVSCOPE_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSCOPE_EMU_ASAN 1
#endif
#endif

#if defined(KVSCOPE_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace kvscope::emu {

#if defined(KVSCOPE_EMU_ASAN)
inline constexpr bool kAsan = true;
inline void emu_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size) {
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
}
inline void emu_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                    size_t* size_old) {
  __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
}
inline void emu_poison(const void* p, size_t n) {
  __asan_poison_memory_region(p, n);
}
inline void emu_unpoison(const void* p, size_t n) {
  __asan_unpoison_memory_region(p, n);
}
#else
inline constexpr bool kAsan = false;
inline void emu_start_switch_fiber(void**, const void*, size_t) {}
inline void emu_finish_switch_fiber(void*, const void**, size_t*) {}
inline void emu_poison(const void*, size_t) {}
inline void emu_unpoison(const void*, size_t) {}
#endif

}  // namespace kvscope::emu
