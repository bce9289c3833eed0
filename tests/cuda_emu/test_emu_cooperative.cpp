// test_emu_cooperative.cpp — the emulator's cooperative launch and grid-wide barrier
// (kernels/launch.cuh launch_cooperative, cuda_compat.cuh grid_sync): every phase reads
// what the other blocks wrote in the phase before; a barrier outside a cooperative launch,
// a grid too large to be resident and a block that skips the barrier fail cleanly, and the
// emulator keeps working after each.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/launch.cuh"

namespace {

using kvscope::cuda::grid_sync;
using kvscope::cuda::launch;
using kvscope::cuda::launch_cooperative;

class EmuCooperative : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

constexpr int kPhases = 4;

// buf [kPhases][n]: in phase p thread g writes g + p + (what thread (g + blockDim) % n, in
// another block, wrote in phase p - 1) — wrong unless the barrier holds every block.
__global__ void phases_kernel(int* buf, int n) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  for (int p = 0; p < kPhases; ++p) {
    const int prev = p == 0 ? 0 : buf[(p - 1) * n + (g + int(blockDim.x)) % n];
    buf[p * n + g] = g + p + prev;
    grid_sync();
  }
}

std::vector<int> phases_reference(int n, int block) {
  std::vector<int> r(size_t(kPhases) * n);
  for (int p = 0; p < kPhases; ++p)
    for (int g = 0; g < n; ++g)
      r[size_t(p) * n + g] = g + p + (p == 0 ? 0 : r[size_t(p - 1) * n + (g + block) % n]);
  return r;
}

int* device_ints(int n) {
  int* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, size_t(n) * sizeof(int)), cudaSuccess);
  return d;
}

bool run_phases(int blocks, int threads) {
  const int n = blocks * threads;
  int* d = device_ints(kPhases * n);
  EXPECT_EQ(launch_cooperative(phases_kernel, dim3(blocks), dim3(threads), 0, nullptr, d, n),
            cudaSuccess)
      << kvscope::emu::last_error_detail();
  std::vector<int> h(size_t(kPhases) * n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, h.size() * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  return h == phases_reference(n, threads);
}

TEST_F(EmuCooperative, EveryPhaseSeesWhatEveryBlockWroteBefore) {
  EXPECT_TRUE(run_phases(8, 64));
  EXPECT_TRUE(run_phases(3, 96));    // partial warps, a grid smaller than the pool
  EXPECT_TRUE(run_phases(16, 128));  // the largest grid of 128 threads
  EXPECT_TRUE(run_phases(1, 32));
  EXPECT_EQ(kvscope::emu::cooperative_kernels_run(), 4u);
}

TEST_F(EmuCooperative, GridLimitComesFromTheOccupancyApi) {
  EXPECT_EQ(kvscope::cuda::cooperative_grid_limit(phases_kernel, 256, 0), 8);
  EXPECT_EQ(kvscope::cuda::cooperative_grid_limit(phases_kernel, 64, 0), 32);
}

TEST_F(EmuCooperative, BarrierOutsideACooperativeLaunchFails) {
  int* d = device_ints(kPhases * 64);
  EXPECT_EQ(launch(phases_kernel, dim3(2), dim3(32), 0, nullptr, d, 64), cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find("not launched cooperatively"), std::string::npos)
      << kvscope::emu::last_error_detail();
  // A failed kernel is sticky, as on a GPU, until the device is reset; then all works.
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  cudaDeviceReset();
  EXPECT_TRUE(run_phases(4, 64));
}

TEST_F(EmuCooperative, GridTooLargeToBeResidentFailsWithoutBreakingTheDevice) {
  int* d = device_ints(kPhases * 9 * 256);
  EXPECT_EQ(launch_cooperative(phases_kernel, dim3(9), dim3(256), 0, nullptr, d, 9 * 256),
            cudaErrorCooperativeLaunchTooLarge);
  EXPECT_NE(kvscope::emu::last_error_detail().find("exceeds the 8"), std::string::npos)
      << kvscope::emu::last_error_detail();
  EXPECT_EQ(cudaGetLastError(), cudaErrorCooperativeLaunchTooLarge);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not sticky: nothing ran
  EXPECT_TRUE(run_phases(8, 256));
}

// Block 1 leaves before the second barrier: the others would wait for ever on a GPU.
__global__ void skip_barrier_kernel(int* buf) {
  buf[blockIdx.x * blockDim.x + threadIdx.x] = 1;
  grid_sync();
  if (blockIdx.x == 1) return;
  grid_sync();
}

// One thread of block 0 leaves before the barrier its block waits at.
__global__ void thread_skips_barrier_kernel(int* buf) {
  if (blockIdx.x == 0 && threadIdx.x == 5) return;
  buf[blockIdx.x * blockDim.x + threadIdx.x] = 1;
  grid_sync();
}

TEST_F(EmuCooperative, ABlockOrThreadSkippingTheBarrierFailsTheLaunch) {
  int* d = device_ints(4 * 64);
  EXPECT_EQ(launch_cooperative(skip_barrier_kernel, dim3(4), dim3(64), 0, nullptr, d),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find("grid barrier"), std::string::npos)
      << kvscope::emu::last_error_detail();
  cudaDeviceReset();
  d = device_ints(4 * 64);
  EXPECT_EQ(launch_cooperative(thread_skips_barrier_kernel, dim3(4), dim3(64), 0, nullptr, d),
            cudaErrorLaunchFailure);
  EXPECT_NE(kvscope::emu::last_error_detail().find("grid barrier"), std::string::npos)
      << kvscope::emu::last_error_detail();
  cudaDeviceReset();
  EXPECT_TRUE(run_phases(8, 64));
}

}  // namespace
