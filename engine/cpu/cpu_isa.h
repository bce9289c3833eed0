// cpu_isa.h — which SIMD instruction set the CPU kernels use, chosen at run time.
//
// The build may run on a CPU other than the one it was compiled on, so the kernels for
// each instruction set live in their own translation unit (engine/cpu/kernels_*.cpp)
// and one of them is picked when first needed: the best the CPU supports, or the one
// named by the environment variable KVSCOPE_CPU_ISA (scalar, avx2, avx512), clamped to
// what the CPU supports. Tests force each path through set_isa().
//
// Within one path every output element of a product is computed with the same
// arithmetic whatever the batch size, so KV CACHE and NO CACHE stay bit-identical.
// Different paths sum in different orders and agree only to rounding.
#pragma once

#include <optional>
#include <string_view>

namespace kvscope::cpu {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

const char* isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);
// Whether this CPU (and the OS) can run the path.
bool isa_supported(Isa isa);
// The best path this CPU supports.
Isa isa_best();
// The path in use now.
Isa isa_active();
// Uses `isa` from now on; false (and no change) when the CPU cannot run it. Call it
// between products, never while one runs on another thread.
bool set_isa(Isa isa);

// The CPU family from CPUID leaf 1 (base family plus extended family) on an AMD CPU, else
// 0: 0x17 is Zen and Zen 2, 0x19 Zen 3 and Zen 4 (only Zen 4 has AVX-512), 0x1A Zen 5. The
// kernels' per-CPU choices (the nibble order, the rows kernel) are made from it.
unsigned amd_cpu_family();

}  // namespace kvscope::cpu
