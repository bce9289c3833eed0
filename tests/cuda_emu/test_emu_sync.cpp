// test_emu_sync.cpp — the emulator's block and warp semantics: __syncthreads really
// separates phases, shuffles follow the PTX rules for every width and partial mask,
// misuse and deadlocks fail the launch with a report instead of hanging.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/last_block.cuh"
#include "kernels/launch.cuh"

namespace {

using kvscope::cuda::launch;

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
  template <class T>
  T* as() {
    return static_cast<T*>(p);
  }
};

class EmuTest : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

// Each thread writes its id to shared memory, syncs, then reads its mirror neighbour:
// without a real barrier the late threads would read 0xFF garbage / stale values.
__global__ void reverse_kernel(int* out, int n) {
  __shared__ int s[256];
  const int t = threadIdx.x;
  s[t] = t * 3 + static_cast<int>(blockIdx.x);
  __syncthreads();
  if (t < n) out[blockIdx.x * n + t] = s[n - 1 - t];
}

TEST_F(EmuTest, SyncthreadsSeparatesPhasesAcrossBlocks) {
  const int n = 200, blocks = 5;
  DeviceBuffer out(sizeof(int) * n * blocks);
  ASSERT_EQ(launch(reverse_kernel, dim3(blocks), dim3(n), 0, nullptr, out.as<int>(), n),
            cudaSuccess);
  std::vector<int> h(n * blocks);
  ASSERT_EQ(cudaMemcpy(h.data(), out.p, h.size() * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t) ASSERT_EQ(h[b * n + t], (n - 1 - t) * 3 + b) << b << " " << t;
}

__global__ void count_kernel(int* out) {
  const int c = __syncthreads_count(threadIdx.x % 3 == 0);
  const int a = __syncthreads_and(threadIdx.x < 1000);
  const int o = __syncthreads_or(threadIdx.x == 77);
  if (threadIdx.x == 0) {
    out[0] = c;
    out[1] = a;
    out[2] = o;
  }
}

TEST_F(EmuTest, SyncthreadsReductions) {
  DeviceBuffer out(3 * sizeof(int));
  ASSERT_EQ(launch(count_kernel, dim3(1), dim3(100), 0, nullptr, out.as<int>()), cudaSuccess);
  int h[3];
  ASSERT_EQ(cudaMemcpy(h, out.p, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 34);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 1);
}

// Threads that return early count as arrived at later barriers.
__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x >= 40) return;
  __shared__ int s[64];
  s[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (int i = 0; i < 40; ++i) sum += s[i];
    out[0] = sum;
  }
}

TEST_F(EmuTest, ExitedThreadsCountAsArrived) {
  DeviceBuffer out(sizeof(int));
  ASSERT_EQ(launch(early_exit_kernel, dim3(1), dim3(64), 0, nullptr, out.as<int>()), cudaSuccess);
  int h = 0;
  ASSERT_EQ(cudaMemcpy(&h, out.p, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h, 40);
}

// out[t] for modes 0 xor, 1 down, 2 up, 3 idx with the given width.
__global__ void shuffle_kernel(int* out, int mode, int arg, int width) {
  const int v = 100 + static_cast<int>(threadIdx.x);
  int r = 0;
  if (mode == 0) r = __shfl_xor_sync(kvscope::cuda::kFullMask, v, arg, width);
  if (mode == 1) r = __shfl_down_sync(kvscope::cuda::kFullMask, v, arg, width);
  if (mode == 2) r = __shfl_up_sync(kvscope::cuda::kFullMask, v, arg, width);
  if (mode == 3) r = __shfl_sync(kvscope::cuda::kFullMask, v, arg, width);
  out[threadIdx.x] = r;
}

int expected_shuffle(int mode, int lane, int arg, int width) {
  const int base = lane / width * width;
  int src = lane;
  if (mode == 0) src = (lane ^ arg) < base + width ? (lane ^ arg) : lane;
  if (mode == 1) src = lane % width + arg < width ? lane + arg : lane;
  if (mode == 2) src = lane % width - arg >= 0 ? lane - arg : lane;
  if (mode == 3) src = base + arg % width;
  return 100 + src;
}

TEST_F(EmuTest, ShufflesMatchPtxSemanticsForAllWidths) {
  DeviceBuffer out(64 * sizeof(int));
  for (int mode = 0; mode < 4; ++mode) {
    for (int width : {2, 4, 8, 16, 32}) {
      for (int arg : {1, 3, 5, 17}) {
        ASSERT_EQ(launch(shuffle_kernel, dim3(1), dim3(64), 0, nullptr, out.as<int>(), mode, arg,
                         width),
                  cudaSuccess)
            << kvscope::emu::last_error_detail();
        int h[64];
        ASSERT_EQ(cudaMemcpy(h, out.p, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int t = 0; t < 64; ++t)
          ASSERT_EQ(h[t], expected_shuffle(mode, t % 32, arg, width) + t / 32 * 32)
              << "mode " << mode << " width " << width << " arg " << arg << " lane " << t;
      }
    }
  }
}

// Butterfly sum over a warp in float, and ballot/any/all.
__global__ void reduce_ballot_kernel(float* sums, unsigned* ballots) {
  float v = static_cast<float>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kvscope::cuda::kFullMask, v, o);
  const unsigned b = __ballot_sync(kvscope::cuda::kFullMask, threadIdx.x % 5 == 0);
  const int any = __any_sync(kvscope::cuda::kFullMask, threadIdx.x == 31);
  const int all = __all_sync(kvscope::cuda::kFullMask, threadIdx.x < 32);
  if (threadIdx.x == 0) {
    sums[0] = v;
    ballots[0] = b;
    ballots[1] = static_cast<unsigned>(any);
    ballots[2] = static_cast<unsigned>(all);
  }
}

TEST_F(EmuTest, WarpReduceAndBallot) {
  DeviceBuffer s(sizeof(float)), b(3 * sizeof(unsigned));
  ASSERT_EQ(launch(reduce_ballot_kernel, dim3(1), dim3(32), 0, nullptr, s.as<float>(),
                   b.as<unsigned>()),
            cudaSuccess);
  float hs;
  unsigned hb[3];
  ASSERT_EQ(cudaMemcpy(&hs, s.p, sizeof hs, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hb, b.p, sizeof hb, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(hs, 496.0f);
  unsigned expect = 0;
  for (int l = 0; l < 32; l += 5) expect |= 1u << l;
  EXPECT_EQ(hb[0], expect);
  EXPECT_EQ(hb[1], 1u);
  EXPECT_EQ(hb[2], 1u);
}

// The two half-warps each reduce with their own partial mask, concurrently.
__global__ void partial_mask_kernel(int* out) {
  const unsigned mask = threadIdx.x < 16 ? 0x0000ffffu : 0xffff0000u;
  int v = static_cast<int>(threadIdx.x);
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  out[threadIdx.x] = v;
}

TEST_F(EmuTest, PartialMasksReduceIndependently) {
  DeviceBuffer out(32 * sizeof(int));
  ASSERT_EQ(launch(partial_mask_kernel, dim3(1), dim3(32), 0, nullptr, out.as<int>()),
            cudaSuccess)
      << kvscope::emu::last_error_detail();
  int h[32];
  ASSERT_EQ(cudaMemcpy(h, out.p, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int t = 0; t < 32; ++t) EXPECT_EQ(h[t], t < 16 ? 120 : 376) << t;
}

// Lane reads a lane outside the mask: undefined on a GPU, so a fault here.
__global__ void inactive_source_kernel(int* out) {
  if (threadIdx.x < 8) out[threadIdx.x] = __shfl_down_sync(0xffu, 1, 1);  // lane 7 reads 8
}

__global__ void not_in_mask_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, 1, 0);  // lane 0 is fine, lane 1 is not in 0x1
}

TEST_F(EmuTest, ShuffleFromLaneOutsideMaskFailsLaunch) {
  DeviceBuffer out(32 * sizeof(int));
  // shfl_down by 1 within mask 0xff: lane 7 would read lane 8, which is not in the mask.
  EXPECT_EQ(launch(inactive_source_kernel, dim3(1), dim3(32), 0, nullptr, out.as<int>()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find("not in mask"), std::string::npos)
      << kvscope::emu::last_error_detail();
  // The error is sticky, as after a real kernel fault.
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
  cudaDeviceReset();
  DeviceBuffer out2(32 * sizeof(int));
  EXPECT_EQ(launch(not_in_mask_kernel, dim3(1), dim3(32), 0, nullptr, out2.as<int>()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find("not in its own mask"), std::string::npos)
      << kvscope::emu::last_error_detail();
}

// A mask naming lanes past the block's last thread (a block of 8 threads, a full-warp
// mask), a mask naming a lane that has already returned, and a shuffle width that is not
// a power of two in [1, 32].
__global__ void absent_lanes_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(kvscope::cuda::kFullMask, 1, 0);
}

__global__ void exited_lane_kernel(int* out) {
  if (threadIdx.x == 31) return;
  out[threadIdx.x] = __shfl_sync(kvscope::cuda::kFullMask, 1, 0);
}

__global__ void bad_width_kernel(int* out, int width) {
  out[threadIdx.x] = __shfl_down_sync(kvscope::cuda::kFullMask, 1, 1, width);
}

TEST_F(EmuTest, MasksNamingAbsentOrExitedLanesOrABadWidthFailLaunch) {
  DeviceBuffer out(32 * sizeof(int));
  EXPECT_EQ(launch(absent_lanes_kernel, dim3(1), dim3(8), 0, nullptr, out.as<int>()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find(
                "__shfl_sync: mask 0xffffffff names lanes that do not exist in warp 0 "
                "(present 0xff)"),
            std::string::npos)
      << kvscope::emu::last_error_detail();
  cudaDeviceReset();
  DeviceBuffer out2(32 * sizeof(int));
  EXPECT_EQ(launch(exited_lane_kernel, dim3(1), dim3(32), 0, nullptr, out2.as<int>()),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find(
                "lane 31 of warp 0 is in mask 0xffffffff but has already exited"),
            std::string::npos)
      << kvscope::emu::last_error_detail();
  for (int width : {0, 3, 64}) {
    cudaDeviceReset();
    DeviceBuffer out3(32 * sizeof(int));
    EXPECT_EQ(launch(bad_width_kernel, dim3(1), dim3(32), 0, nullptr, out3.as<int>(), width),
              cudaErrorLaunchFailure);
    EXPECT_NE(
        kvscope::emu::last_error_detail().find("warp shuffle: width " + std::to_string(width) +
                                               " is not a power of two in [1, 32]"),
        std::string::npos)
        << kvscope::emu::last_error_detail();
  }
}

// Thread 0 waits in a full-warp shuffle while everyone else waits at __syncthreads.
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x == 0) {
    out[0] = __shfl_sync(kvscope::cuda::kFullMask, 1, 0);
  } else {
    __syncthreads();
  }
}

TEST_F(EmuTest, DeadlockIsReportedNotHung) {
  DeviceBuffer out(sizeof(int));
  EXPECT_EQ(launch(deadlock_kernel, dim3(2), dim3(64), 0, nullptr, out.as<int>()),
            cudaErrorLaunchFailure);
  const std::string d = kvscope::emu::last_error_detail();
  EXPECT_NE(d.find("deadlock"), std::string::npos) << d;
  EXPECT_NE(d.find("__syncthreads"), std::string::npos) << d;
  EXPECT_NE(d.find("__shfl_sync"), std::string::npos) << d;
}

__global__ void dyn_smem_kernel(float* out, int n) {
  KVSCOPE_DYN_SMEM(float, s);
  const int t = threadIdx.x;
  if (t == 0) {
    // Dynamic shared memory starts as 0xFF bytes (NaN) so unwritten reads show up.
    out[n] = s[n - 1];
  }
  __syncthreads();
  s[t] = 2.0f * t;
  __syncthreads();
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += s[i];
  out[t] = sum;
  atomicAdd(&out[n + 1], 1.0f);
}

TEST_F(EmuTest, DynamicSharedMemoryAndAtomics) {
  const int n = 96;
  DeviceBuffer out((n + 2) * sizeof(float));
  ASSERT_EQ(cudaMemset(out.p, 0, (n + 2) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(launch(dyn_smem_kernel, dim3(3), dim3(n), n * sizeof(float), nullptr, out.as<float>(),
                   n),
            cudaSuccess);
  std::vector<float> h(n + 2);
  ASSERT_EQ(cudaMemcpy(h.data(), out.p, h.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(h[0], float(n * (n - 1)));
  EXPECT_TRUE(std::isnan(h[n]));
  EXPECT_EQ(h[n + 1], 3.0f * n);
}

__global__ void noop_kernel(float* p) {
  if (p) p[threadIdx.x] = 0;
}

TEST_F(EmuTest, BadLaunchConfigurationsAreRejected) {
  DeviceBuffer out(2048 * sizeof(float));
  EXPECT_EQ(launch(noop_kernel, dim3(1), dim3(1025), 0, nullptr, out.as<float>()),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky
  EXPECT_EQ(launch(noop_kernel, dim3(0), dim3(32), 0, nullptr, out.as<float>()),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch(noop_kernel, dim3(1, 70000), dim3(32), 0, nullptr, out.as<float>()),
            cudaErrorInvalidConfiguration);
  EXPECT_EQ(launch(noop_kernel, dim3(1), dim3(8, 8, 65), 0, nullptr, out.as<float>()),
            cudaErrorInvalidConfiguration);
  // 64 KiB of dynamic shared memory needs an explicit opt-in.
  EXPECT_EQ(launch(noop_kernel, dim3(1), dim3(32), 64 * 1024, nullptr, out.as<float>()),
            cudaErrorInvalidConfiguration);
  ASSERT_EQ(cudaFuncSetAttribute(reinterpret_cast<const void*>(noop_kernel),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  EXPECT_EQ(launch(noop_kernel, dim3(1), dim3(32), 64 * 1024, nullptr, out.as<float>()),
            cudaSuccess);
  EXPECT_EQ(launch(noop_kernel, dim3(1), dim3(32), 0, nullptr, nullptr), cudaSuccess);
}

TEST_F(EmuTest, HostPointerArgumentIsRejected) {
  std::vector<float> host(64);
  EXPECT_EQ(launch(noop_kernel, dim3(1), dim3(32), 0, nullptr, host.data()),
            cudaErrorIllegalAddress);
  EXPECT_NE(kvscope::emu::last_error_detail().find("argument 0"), std::string::npos);
  EXPECT_EQ(host[0], 0.0f);  // the kernel never ran
}

// Every block writes its share, then the last to arrive (kernels/last_block.cuh) sums all
// shares: on four workers (blocks concurrently, finishing in any order) exactly one block
// per launch runs the epilogue, it sees every other block's writes, and the counter is
// back to zero for the next launch.
__global__ void last_block_sum(int* shares, unsigned* counter, int* epilogues, int* total) {
  __shared__ int flag;
  if (threadIdx.x == 0) shares[blockIdx.x] = int(blockIdx.x) + 1;
  if (!kvscope::cuda::last_block_to_arrive(counter, gridDim.x, &flag)) return;
  if (threadIdx.x != 0) return;
  atomicAdd(epilogues, 1);
  int s = 0;
  for (unsigned b = 0; b < gridDim.x; ++b) s += shares[b];
  *total = s;
}

TEST_F(EmuTest, LastBlockToArriveSeesEveryBlock) {
  const int before = kvscope::emu::workers();
  kvscope::emu::set_workers(4);
  EXPECT_EQ(kvscope::emu::workers(), 4);
  constexpr int kBlocks = 37;
  DeviceBuffer shares(kBlocks * sizeof(int)), counter(sizeof(unsigned)), epilogues(sizeof(int)),
      total(sizeof(int));
  ASSERT_EQ(cudaMemset(counter.p, 0, sizeof(unsigned)), cudaSuccess);
  ASSERT_EQ(cudaMemset(epilogues.p, 0, sizeof(int)), cudaSuccess);
  for (int rep = 0; rep < 20; ++rep) {
    ASSERT_EQ(cudaMemset(shares.p, 0, kBlocks * sizeof(int)), cudaSuccess);
    ASSERT_EQ(launch(last_block_sum, dim3(kBlocks), dim3(64), 0, nullptr, shares.as<int>(),
                     counter.as<unsigned>(), epilogues.as<int>(), total.as<int>()),
              cudaSuccess);
    int got = 0, n = 0;
    unsigned c = 1;
    ASSERT_EQ(cudaMemcpy(&got, total.p, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&n, epilogues.p, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&c, counter.p, sizeof(unsigned), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, kBlocks * (kBlocks + 1) / 2) << "launch " << rep;
    EXPECT_EQ(n, rep + 1) << "launch " << rep;
    EXPECT_EQ(c, 0u) << "launch " << rep;
  }
  kvscope::emu::set_workers(before);
  EXPECT_EQ(kvscope::emu::workers(), before);
}

}  // namespace
