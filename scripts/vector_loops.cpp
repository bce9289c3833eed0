// vector_loops.cpp — what this core's vector pipes allow for the products' inner loops:
// the time of loops of independent chains of one instruction mix, in registers (the
// widening load's bytes from L1), one thread. Each mix is the per-vector work of one
// product kernel (engine/cpu/kernels_impl.h): for the single-token product of 4-bit words,
// a mask, a convert and a multiply-add per vector of weights; for the Q8_0 LM head, a
// widening load, a convert and a multiply-add. With the kernels' ceiling that `kvscope
// bench` prints (products in cache), this says how close the kernels are to the bound of
// their own instructions. Built and run by scripts/vector_loops.sh.
//
// Compiled twice by that script: -DKVSCOPE_LOOPS_512 (zmm, 8 chains; run only where the
// CPU has AVX-512F) and without (ymm, 6 chains for the mixes and 8 for the bare
// multiply-add, within the 16 registers AVX2 has). Every chain has its own accumulator
// and temporary; the weights' source and the constants are read-only, so no chain waits
// on another and each loop runs at the rate of its pipes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

alignas(64) float g_consts[16 * 4];
alignas(64) int8_t g_bytes[64];

// Runs loop(n) and returns ns per iteration, the best of `runs`.
template <class F>
double best_ns(F loop, long n, int runs) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    loop(n);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / double(n));
  }
  return best;
}

// The register names: V, the width's prefix; W, the weights' source; X, x; M, the mask;
// L, the table; ANDI, the mask instruction (vpandd, or VEX's vpand for 256-bit on CPUs
// without AVX-512).
#ifdef KVSCOPE_LOOPS_512
constexpr const char* kWidth = "512-bit (zmm)";
constexpr int kChains = 8;
// Accumulators zmm0-7, temporaries zmm20-27.
#define KV_V "%%zmm"
#define KV_W "16"
#define KV_X "17"
#define KV_M "18"
#define KV_L "19"
#define KV_ANDI "vpandd "
#define KV_CHAINS(OP) OP(0, 20) OP(1, 21) OP(2, 22) OP(3, 23) OP(4, 24) OP(5, 25) OP(6, 26) OP(7, 27)
#define KV_FMA_CHAINS KV_CHAINS(KV_FMA)
#define KV_CLOBBERS                                                                         \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm16", "xmm17", "xmm18", \
      "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27"
#else
constexpr const char* kWidth = "256-bit (ymm)";
constexpr int kChains = 6;
// Accumulators ymm0-5 (ymm0-7 for the bare multiply-add), temporaries ymm6-11.
#define KV_V "%%ymm"
#define KV_W "12"
#define KV_X "13"
#define KV_M "14"
#define KV_L "15"
#define KV_ANDI "vpand "
#define KV_CHAINS(OP) OP(0, 6) OP(1, 7) OP(2, 8) OP(3, 9) OP(4, 10) OP(5, 11)
#define KV_FMA_CHAINS KV_CHAINS(KV_FMA) KV_FMA(6, 0) KV_FMA(7, 0)
#define KV_CLOBBERS                                                                          \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
      "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"
#endif

#define KV_R(r) KV_V #r
#define KV_INIT                                                                      \
  "vmovups (%[c]), " KV_V KV_W "\n\t vmovups 64(%[c]), " KV_V KV_X "\n\t"           \
  "vmovups 128(%[c]), " KV_V KV_M "\n\t vmovups 192(%[c]), " KV_V KV_L "\n\t"       \
  KV_SET(0) KV_SET(1) KV_SET(2) KV_SET(3) KV_SET(4) KV_SET(5) KV_SET(6) KV_SET(7)
#define KV_SET(a) "vmovaps " KV_V KV_X ", " KV_R(a) "\n\t"
#define KV_FMA(a, t) "vfmadd231ps " KV_V KV_X ", " KV_V KV_X ", " KV_R(a) "\n\t"
#define KV_CVT(a, t) "vcvtdq2ps " KV_V KV_W ", " KV_R(t) "\n\t"
#define KV_LUT(a, t) "vpermps " KV_V KV_L ", " KV_V KV_W ", " KV_R(t) "\n\t"
#define KV_AND(a, t) KV_ANDI KV_V KV_M ", " KV_V KV_W ", " KV_R(t) "\n\t"
// The multiply-add of a decoded vector t into chain a.
#define KV_ACC(a, t) "vfmadd231ps " KV_V KV_X ", " KV_R(t) ", " KV_R(a) "\n\t"
#define KV_AND_CVT_FMA(a, t) \
  KV_AND(a, t) "vcvtdq2ps " KV_R(t) ", " KV_R(t) "\n\t" KV_ACC(a, t)
#define KV_SRL_LUT_FMA(a, t)                                  \
  "vpsrld $4, " KV_V KV_W ", " KV_R(t) "\n\t"                 \
  "vpermps " KV_V KV_L ", " KV_R(t) ", " KV_R(t) "\n\t" KV_ACC(a, t)
#define KV_LUT_FMA(a, t) KV_LUT(a, t) KV_ACC(a, t)
#define KV_WIDEN_CVT_FMA(a, t)                          \
  "vpmovsxbd (%[b]), " KV_R(t) "\n\t"                   \
  "vcvtdq2ps " KV_R(t) ", " KV_R(t) "\n\t" KV_ACC(a, t)

// One loop: the constants loaded, then n iterations of BODY.
#define KV_LOOP(NAME, BODY)                                                        \
  void NAME(long n) {                                                              \
    asm volatile(KV_INIT "1:\n\t" BODY "dec %[n]\n\t jnz 1b\n\t vzeroupper"       \
                 : [n] "+r"(n)                                                     \
                 : [c] "r"(g_consts), [b] "r"(g_bytes)                             \
                 : KV_CLOBBERS, "cc", "memory");                                   \
  }

KV_LOOP(loop_fma, KV_FMA_CHAINS)
KV_LOOP(loop_cvt, KV_CHAINS(KV_CVT))
KV_LOOP(loop_lut, KV_CHAINS(KV_LUT))
KV_LOOP(loop_and, KV_CHAINS(KV_AND))
KV_LOOP(loop_and_cvt_fma, KV_CHAINS(KV_AND_CVT_FMA))
KV_LOOP(loop_lut_fma, KV_CHAINS(KV_LUT_FMA))
KV_LOOP(loop_srl_lut_fma, KV_CHAINS(KV_SRL_LUT_FMA))
KV_LOOP(loop_widen_cvt_fma, KV_CHAINS(KV_WIDEN_CVT_FMA))

}  // namespace

int main(int argc, char** argv) {
  // Normal floats everywhere (no subnormal slow paths): x = 1 + 2^-20, words of nibbles,
  // the mask 0xF0, the 16 nibble values.
  for (int i = 0; i < 16; ++i) {
    reinterpret_cast<uint32_t*>(g_consts)[i] = 0x12345678u + uint32_t(i);
    g_consts[16 + i] = 1.0f + 0x1p-20f;
    reinterpret_cast<uint32_t*>(g_consts)[32 + i] = 0xF0u;
    g_consts[48 + i] = float(i);
  }
  for (int i = 0; i < 64; ++i) g_bytes[i] = int8_t(i - 32);
  // Iterations per run (argument 1; 20 million by default).
  const long n = argc > 1 ? std::max(1L, std::atol(argv[1])) : 20'000'000;
  const int runs = 5;
  const int fma_chains = 8;
  struct Mix {
    const char* name;
    void (*loop)(long);
    int chains;
  };
  const Mix mixes[] = {
      {"multiply-add", loop_fma, fma_chains},
      {"convert (vcvtdq2ps)", loop_cvt, kChains},
      {"table lookup (vpermps)", loop_lut, kChains},
      {"mask (vpand, vpandd)", loop_and, kChains},
      {"mask + convert + multiply-add", loop_and_cvt_fma, kChains},
      {"table lookup + multiply-add", loop_lut_fma, kChains},
      {"shift + table lookup + multiply-add", loop_srl_lut_fma, kChains},
      {"widening load + convert + multiply-add", loop_widen_cvt_fma, kChains},
  };
  loop_fma(n);  // warm up: clocks and the vector units' power state
  std::printf("vector_loops: %s, one thread, best of %d runs of %ld iterations\n", kWidth, runs, n);
  std::printf("%-40s %8s %14s\n", "mix (each chain: one of each)", "chains", "ns per vector");
  for (const Mix& m : mixes) {
    const double ns = best_ns(m.loop, n, runs);
    // ns per vector of weights (one chain's one pass through the mix).
    std::printf("%-40s %8d %14.3f\n", m.name, m.chains, ns / m.chains);
  }
  return 0;
}
