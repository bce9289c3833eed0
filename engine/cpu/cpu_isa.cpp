// cpu_isa.cpp — run-time choice of the SIMD path (see cpu_isa.h).
#include "engine/cpu/cpu_isa.h"

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kvscope::cpu {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports has no "f16c".
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

Isa initial_isa() {
  Isa isa = isa_best();
  if (const char* env = std::getenv("KVSCOPE_CPU_ISA")) {
    // A path the CPU lacks falls back to the best one below it.
    if (auto want = isa_from_name(env); want && int(*want) < int(isa)) isa = *want;
  }
  return isa;
}

std::atomic<int>& active() {
  static std::atomic<int> isa{int(initial_isa())};
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (name == isa_name(isa)) return isa;
  return std::nullopt;
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return cpu_has_avx512();
    case Isa::Avx2:
      return cpu_has_avx2();
    default:
      return true;
  }
}

Isa isa_best() {
  static const Isa best = cpu_has_avx512() ? Isa::Avx512 : cpu_has_avx2() ? Isa::Avx2 : Isa::Scalar;
  return best;
}

Isa isa_active() {
  return Isa(active().load(std::memory_order_relaxed));
}

bool set_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  active().store(int(isa), std::memory_order_relaxed);
  return true;
}

unsigned amd_cpu_family() {
#if defined(__x86_64__) || defined(__i386__)
  static const unsigned family = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_is("amd")) return 0u;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0u;
    const unsigned base = (a >> 8) & 0xF;
    return base == 0xF ? base + ((a >> 20) & 0xFF) : base;
  }();
  return family;
#else
  return 0;
#endif
}

}  // namespace kvscope::cpu
