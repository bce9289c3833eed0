// test_kernel_kv_rerotate.cpp — the context shift's K re-rotation kernel under the CUDA
// emulator against the CPU's RoPE (engine/cpu/elementwise.h): rows of positions >= first
// rotate by delta, adjacent and NeoX pairs, f32 and f16 caches, a ring layout with empty
// slots; rows below first and empty slots are left untouched (bit for bit).
// Tolerances: f32 — the kernel rotates with explicit fmas, the CPU without, so a value
// may differ by a few fp32 roundings of inputs of magnitude <= 2 (2e-6); f16 — that
// difference can flip one fp16 rounding: one fp16 step of 2 (2^-9).
#include <gtest/gtest.h>

#include "engine/cpu/elementwise.h"
#include "engine/quant.h"
#include "tests/kernels/kernel_test_util.h"

namespace kvscope::test {
namespace {

void check(bool f16, bool neox) {
  constexpr int Hkv = 2, D = 32, n_rot = 24, n_slots = 12, first = 3, delta = -7;
  // Slot s holds position pos[s]: a wrapped ring with two empty slots.
  const std::vector<int32_t> pos{12, 13, 14, 3, 4, -1, 6, 7, 8, -1, 10, 11};
  const auto vals = random_floats(size_t(Hkv) * n_slots * D, 41, -2.f, 2.f);
  std::vector<float> want = vals;  // what each stored element should read back as
  std::vector<uint16_t> halves(vals.size());
  if (f16) {
    for (size_t i = 0; i < vals.size(); ++i) {
      halves[i] = kvscope::fp32_to_fp16(vals[i]);
      want[i] = kvscope::fp16_to_fp32(halves[i]);
    }
  }
  const std::vector<float> before = want;
  for (int s = 0; s < n_slots; ++s)
    if (pos[size_t(s)] >= first)
      for (int h = 0; h < Hkv; ++h)
        kvscope::cpu::rope_rows(want.data() + (size_t(h) * n_slots + s) * D, 1, 1, D,
                                neox ? kvscope::RopeStyle::NeoX : kvscope::RopeStyle::Adjacent,
                                n_rot, 10000.0f, 1.0f, delta);
  DevVec<float> k32(vals);
  DevVec<uint16_t> k16(halves);
  DevVec<float> v(size_t(Hkv) * n_slots * D);
  DevVec<int32_t> p(pos);
  const kvscope::cuda::KvLayer kv =
      kv_layer(f16 ? static_cast<void*>(k16.p) : k32.p, v.p, f16, Hkv, D, n_slots, p.p);
  const kvscope::cuda::RopeArgs r{n_rot, neox ? 1 : 0, 10000.0f, 1.0f};
  ASSERT_EQ(kvscope::cuda::kv_rerotate(kv, r, first, delta, nullptr), cudaSuccess);
  std::vector<float> got = f16 ? std::vector<float>(vals.size()) : k32.get();
  if (f16) {
    const auto h = k16.get();
    for (size_t i = 0; i < h.size(); ++i) got[i] = kvscope::fp16_to_fp32(h[i]);
  }
  EXPECT_TRUE(all_close(got, want, f16 ? 1.0f / 512 : 2e-6f, 0.0f))
      << (f16 ? "f16" : "f32") << (neox ? " neox" : " adjacent");
  // Rows below first and empty slots are exactly as they were.
  for (int s = 0; s < n_slots; ++s)
    if (pos[size_t(s)] < first)
      for (int h = 0; h < Hkv; ++h)
        for (int d = 0; d < D; ++d) {
          const size_t i = (size_t(h) * n_slots + s) * D + d;
          ASSERT_EQ(got[i], before[i]) << "slot " << s << " head " << h << " dim " << d;
        }
}

TEST(KernelKvRerotate, MatchesTheCpuRotationByTheDelta) {
  for (bool f16 : {false, true})
    for (bool neox : {false, true}) check(f16, neox);
}

TEST(KernelKvRerotate, RejectsBadArguments) {
  DevVec<float> k(64), v(64);
  DevVec<int32_t> p(std::vector<int32_t>{0, 1});
  const kvscope::cuda::KvLayer kv = kv_layer(k.p, v.p, false, 1, 32, 2, p.p);
  EXPECT_NE(kvscope::cuda::kv_rerotate(kv, {33, 0, 10000.0f, 1.0f}, 0, -1, nullptr), cudaSuccess);
  EXPECT_NE(kvscope::cuda::kv_rerotate(kv, {8, 0, 10000.0f, 1.0f}, -1, -1, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace kvscope::test
