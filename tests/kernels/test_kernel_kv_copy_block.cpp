// test_kernel_kv_copy_block.cpp — the pool's copy kernels under the CUDA emulator, byte for
// byte against copies made on the host, in every layer, K and V (of different row sizes)
// and kv head; every other byte of the pool stays as it was:
//   kv_copy_block  block src's rows land on block dst's;
//   kv_move_rows   moves run in their order, as separate copies on one stream would (a
//                  later move overwrites rows an earlier one read; another reads rows an
//                  earlier one wrote).
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

// A pool's storage in device memory: L layers of K and V, each [Hkv][B * n_blocks] rows of
// rb[0] (K) or rb[1] (V) random bytes; `host` keeps what was uploaded.
struct PoolBuffers {
  static constexpr int L = 3, Hkv = 2, B = 8, n_blocks = 5, rows = B * n_blocks;
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DevVec<uint8_t>>> dev;
  std::unique_ptr<DevVec<void*>> dev_bases;
  kvscope::cuda::KvPoolCopy p;

  PoolBuffers(int64_t rb_k, int64_t rb_v, uint32_t seed) {
    const int64_t rb[2] = {rb_k, rb_v};
    std::vector<void*> bases;
    for (int i = 0; i < 2 * L; ++i) {
      host.push_back(random_bytes(size_t(Hkv) * rows * size_t(rb[i % 2]), seed + uint32_t(i)));
      dev.push_back(std::make_unique<DevVec<uint8_t>>(host.back()));
      bases.push_back(dev.back()->p);
    }
    dev_bases = std::make_unique<DevVec<void*>>(bases);
    p.bases = dev_bases->p;
    p.n_bases = 2 * L;
    p.n_head_kv = Hkv;
    p.block = B;
    p.rows = rows;
    p.row_bytes[0] = rb[0];
    p.row_bytes[1] = rb[1];
  }
};

TEST(KernelKvCopyBlock, CopiesEveryLayerSideAndHeadAndNothingElse) {
  // K f16 rows of 64 values (128 bytes), V q8_0 rows (2 blocks of 34 bytes).
  PoolBuffers pool(128, 68, 100);
  const kvscope::cuda::KvPoolCopy& p = pool.p;
  constexpr int dst = 1, src = 3;
  ASSERT_EQ(kvscope::cuda::kv_copy_block(p, dst, src, nullptr), cudaSuccess);
  for (int i = 0; i < 2 * PoolBuffers::L; ++i) {
    std::vector<uint8_t> want = pool.host[size_t(i)];
    const size_t rb = size_t(p.row_bytes[i % 2]), bb = size_t(p.block) * rb,
                 hb = size_t(p.rows) * rb;
    for (int h = 0; h < PoolBuffers::Hkv; ++h)
      std::memcpy(want.data() + h * hb + dst * bb, pool.host[size_t(i)].data() + h * hb + src * bb,
                  bb);
    EXPECT_EQ(pool.dev[size_t(i)]->get(), want) << "buffer " << i;
  }
  // A block past the buffers, or sizes that are not multiples of 16, are refused.
  EXPECT_EQ(kvscope::cuda::kv_copy_block(p, PoolBuffers::n_blocks, src, nullptr),
            cudaErrorInvalidValue);
  kvscope::cuda::KvPoolCopy odd = p;
  odd.row_bytes[1] = 17;  // blocks of 8 * 17 = 136 bytes
  EXPECT_EQ(kvscope::cuda::kv_copy_block(odd, dst, src, nullptr), cudaErrorInvalidValue);
  cudaDeviceReset();
}

TEST(KernelKvCopyBlock, RowMovesRunInOrderInEveryBufferAndHead) {
  // Rows of q4_0 and q8_0 with 64 values: 36 and 68 bytes (copied 4 bytes at a time), and
  // f16 rows of 60 values (120 bytes: 8 at a time) against q4_0 rows of 32 (18: 2 at a time).
  for (const auto& rbs :
       {std::pair<int64_t, int64_t>{36, 68}, std::pair<int64_t, int64_t>{120, 18}}) {
    SCOPED_TRACE("row bytes " + std::to_string(rbs.first) + ", " + std::to_string(rbs.second));
    PoolBuffers pool(rbs.first, rbs.second, 200);
    const kvscope::cuda::KvPoolCopy& p = pool.p;
    // 9..11 -> 1..3; then 17..19 -> 9..11 (over the rows the first read); then 2..3 ->
    // 25..26 (rows the first wrote, a row further on: other threads wrote them); then one
    // row, 33 -> 16.
    const std::vector<kvscope::cuda::KvRowMove> moves = {
        {1, 9, 3}, {9, 17, 3}, {25, 2, 2}, {16, 33, 1}};
    DevVec<kvscope::cuda::KvRowMove> dev_moves(moves);
    ASSERT_EQ(kvscope::cuda::kv_move_rows(p, dev_moves.p, int(moves.size()), nullptr), cudaSuccess);
    for (int i = 0; i < 2 * PoolBuffers::L; ++i) {
      std::vector<uint8_t> want = pool.host[size_t(i)];
      const size_t r = size_t(p.row_bytes[i % 2]), hb = size_t(p.rows) * r;
      for (const auto& m : moves)
        for (int h = 0; h < PoolBuffers::Hkv; ++h)
          std::memmove(want.data() + h * hb + size_t(m.dst) * r,
                       want.data() + h * hb + size_t(m.src) * r, size_t(m.n) * r);
      EXPECT_EQ(pool.dev[size_t(i)]->get(), want) << "buffer " << i;
    }
  }
  cudaDeviceReset();
}

}  // namespace
}  // namespace kvscope::test
