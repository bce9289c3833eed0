// test_kernel_kv_copy_block.cpp — the pool's copy-on-write kernel under the CUDA emulator:
// block src's rows land on block dst's in every layer, K and V (of different row sizes),
// every kv head, byte for byte; every other byte of the pool stays as it was.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tests/kernels/kernel_test_util.h"

namespace kvscope::test {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = uint8_t(rng());
  return v;
}

TEST(KernelKvCopyBlock, CopiesEveryLayerSideAndHeadAndNothingElse) {
  // 3 layers; K f16 rows of 64 values (128 bytes), V q8_0 rows (2 blocks of 34 bytes).
  constexpr int L = 3, Hkv = 2, B = 8, n_blocks = 5, rows = B * n_blocks;
  const int64_t rb[2] = {128, 68};
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DevVec<uint8_t>>> dev;
  std::vector<void*> bases;
  for (int i = 0; i < 2 * L; ++i) {
    host.push_back(random_bytes(size_t(Hkv) * rows * size_t(rb[i % 2]), 100 + uint32_t(i)));
    dev.push_back(std::make_unique<DevVec<uint8_t>>(host.back()));
    bases.push_back(dev.back()->p);
  }
  DevVec<void*> dev_bases(bases);
  kvscope::cuda::KvPoolCopy p;
  p.bases = dev_bases.p;
  p.n_bases = 2 * L;
  p.n_head_kv = Hkv;
  for (int s = 0; s < 2; ++s) {
    p.block_bytes[s] = B * rb[s];
    p.head_bytes[s] = rows * rb[s];
  }
  constexpr int dst = 1, src = 3;
  ASSERT_EQ(kvscope::cuda::kv_copy_block(p, dst, src, nullptr), cudaSuccess);
  for (int i = 0; i < 2 * L; ++i) {
    std::vector<uint8_t> want = host[size_t(i)];
    const size_t bb = size_t(p.block_bytes[i % 2]), hb = size_t(p.head_bytes[i % 2]);
    for (int h = 0; h < Hkv; ++h)
      std::memcpy(want.data() + h * hb + dst * bb, host[size_t(i)].data() + h * hb + src * bb, bb);
    EXPECT_EQ(dev[size_t(i)]->get(), want) << "buffer " << i;
  }
  // A block past the buffers, or sizes that are not multiples of 16, are refused.
  EXPECT_EQ(kvscope::cuda::kv_copy_block(p, n_blocks, src, nullptr), cudaErrorInvalidValue);
  kvscope::cuda::KvPoolCopy odd = p;
  odd.block_bytes[1] = 4 * 34;  // 136 bytes
  odd.head_bytes[1] = odd.block_bytes[1] * n_blocks;
  EXPECT_EQ(kvscope::cuda::kv_copy_block(odd, dst, src, nullptr), cudaErrorInvalidValue);
  cudaDeviceReset();
}

}  // namespace
}  // namespace kvscope::test
