// test_emu_runtime.cpp — the emulated runtime API (allocation registry, copies, streams,
// events, graphs, sticky errors, programmatic dependent launch) and the cuBLAS subset against a
// naive reference with both transposes and leading dimensions larger than the matrices.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/launch.cuh"
#include "kernels/emu/emu_sanitizer.h"

namespace {

class EmuRuntime : public ::testing::Test {
 protected:
  void TearDown() override { cudaDeviceReset(); }
};

TEST_F(EmuRuntime, MallocFillsWithNaNAndCopiesAreChecked) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16 * sizeof(float)), cudaSuccess);
  std::vector<float> h(16, 0.f);
  ASSERT_EQ(cudaMemcpy(h.data(), d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float v : h) EXPECT_TRUE(std::isnan(v));
  // Past the end of the allocation, wrong direction, host pointer as device.
  EXPECT_EQ(cudaMemcpy(h.data(), d, 68, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, h.data(), 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), h.data() + 8, 4, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d + 4, h.data(), 48, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d + 5, h.data(), 48, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // double free
}

TEST_F(EmuRuntime, OutOfMemoryIsAnError) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, size_t(1) << 40), cudaErrorMemoryAllocation);
  EXPECT_EQ(p, nullptr);
}

__global__ void store_byte_kernel(unsigned char* p, int at, int value) {
  if (threadIdx.x == 0) p[at] = static_cast<unsigned char>(value);
}

// cudaMalloc rounds to 256 bytes like the real one, but the bytes past the requested size
// are a guard: a kernel that writes one byte past a 100-byte buffer fails, at the access
// under AddressSanitizer, at the end of the launch otherwise.
TEST_F(EmuRuntime, KernelWriteOneBytePastAnAllocationIsCaught) {
  unsigned char* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 100), cudaSuccess);
  ASSERT_EQ(kvscope::cuda::launch(store_byte_kernel, dim3(1), dim3(32), 0, nullptr, d, 99, 7),
            cudaSuccess);
#if defined(KVSCOPE_EMU_ASAN)
  EXPECT_DEATH(
      (void)kvscope::cuda::launch(store_byte_kernel, dim3(1), dim3(32), 0, nullptr, d, 100, 7),
      "use-after-poison");
  EXPECT_DEATH(
      (void)kvscope::cuda::launch(store_byte_kernel, dim3(1), dim3(32), 0, nullptr, d, 255, 7),
      "use-after-poison");
#else
  EXPECT_EQ(kvscope::cuda::launch(store_byte_kernel, dim3(1), dim3(32), 0, nullptr, d, 100, 7),
            cudaErrorIllegalAddress);
  EXPECT_NE(kvscope::emu::last_error_detail().find("past the end of the 100-byte device allocation"),
            std::string::npos)
      << kvscope::emu::last_error_detail();
  // The failure is sticky, like a faulting kernel on a GPU.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  cudaDeviceReset();
  // The far end of the 256-byte rounding is guarded too, and so is cudaFree.
  ASSERT_EQ(cudaMalloc(&d, 100), cudaSuccess);
  EXPECT_EQ(kvscope::cuda::launch(store_byte_kernel, dim3(1), dim3(32), 0, nullptr, d, 255, 0xFF),
            cudaErrorIllegalAddress);
  cudaDeviceReset();
  ASSERT_EQ(cudaMalloc(&d, 256), cudaSuccess);  // a multiple of 256 still has a guard
  EXPECT_EQ(kvscope::cuda::launch(store_byte_kernel, dim3(1), dim3(32), 0, nullptr, d, 256, 0),
            cudaErrorIllegalAddress);
  cudaDeviceReset();
#endif
}

__global__ void scale_kernel(float* x, float s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

TEST_F(EmuRuntime, StreamsEventsAndGraphReplay) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t a, b;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  float* d = nullptr;
  const int n = 100;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  std::vector<float> h(n, 1.f);
  ASSERT_EQ(cudaMemcpyAsync(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle);  // not recorded
  ASSERT_EQ(cudaEventRecord(a, s), cudaSuccess);
  ASSERT_EQ(kvscope::cuda::launch(scale_kernel, dim3(4), dim3(32), 0, s, d, 2.f, n), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(b, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 0.f);

  // Captured work does not run until the graph is launched; each launch replays it.
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(kvscope::cuda::launch(scale_kernel, dim3(4), dim3(32), 0, s, d, 3.f, n), cudaSuccess);
  cudaGraph_t g;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t ge;
  ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[n - 1], 2.f);
  ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(h[0], 18.f);
  EXPECT_EQ(h[n - 1], 18.f);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
}

// ---- programmatic dependent launch ------------------------------------------------------

__global__ void waiting_scale_kernel(float* x, float s, int n) {
  kvscope::cuda::grid_dependency_wait();
  kvscope::cuda::grid_dependents_launch();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

// Only the threads of block 0 wait: the rest could read x before the previous kernel wrote it.
__global__ void partly_waiting_kernel(float* x, int n) {
  if (blockIdx.x == 0) kvscope::cuda::grid_dependency_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.f;
}

// A launch with the PDL attribute (kernels/launch.cuh, inside a ProgrammaticLaunchScope)
// is counted, and it fails unless every thread of every block waited for the previous
// grid; without the attribute the same kernel runs. Captured into a graph, the check is
// made again at every replay.
TEST_F(EmuRuntime, ProgrammaticLaunchFailsUnlessEveryThreadWaits) {
  float* d = nullptr;
  const int n = 100;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  std::vector<float> h(n, 1.f);
  ASSERT_EQ(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_FALSE(kvscope::cuda::programmatic_launch());
  ASSERT_EQ(kvscope::cuda::launch(partly_waiting_kernel, dim3(4), dim3(32), 0, nullptr, d, n),
            cudaSuccess);
  EXPECT_EQ(kvscope::emu::programmatic_kernels_run(), 0u);
  EXPECT_EQ(kvscope::emu::kernels_all_waited(), 0u);
  {
    kvscope::cuda::ProgrammaticLaunchScope pdl(true);
    EXPECT_TRUE(kvscope::cuda::programmatic_launch());
    {
      kvscope::cuda::ProgrammaticLaunchScope inner(false);  // scopes nest
      EXPECT_FALSE(kvscope::cuda::programmatic_launch());
    }
    ASSERT_EQ(kvscope::cuda::launch(waiting_scale_kernel, dim3(4), dim3(32), 0, nullptr, d, 2.f, n),
              cudaSuccess);
    EXPECT_EQ(kvscope::emu::programmatic_kernels_run(), 1u);
    EXPECT_EQ(kvscope::emu::kernels_all_waited(), 1u);

    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(kvscope::cuda::launch(waiting_scale_kernel, dim3(4), dim3(32), 0, s, d, 3.f, n),
              cudaSuccess);
    cudaGraph_t g;
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    cudaGraphExec_t ge;
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
    EXPECT_EQ(kvscope::emu::programmatic_kernels_run(), 3u);
    EXPECT_EQ(kvscope::emu::kernels_all_waited(), 3u);
    ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(h[n - 1], 2.f * 2.f * 3.f * 3.f);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    EXPECT_EQ(kvscope::cuda::launch(partly_waiting_kernel, dim3(4), dim3(32), 0, nullptr, d, n),
              cudaErrorLaunchFailure);
  }
  const std::string detail = kvscope::emu::last_error_detail();
  EXPECT_NE(detail.find("block (1,0,0) thread (0,0,0) exited without grid_dependency_wait()"),
            std::string::npos)
      << detail;
  EXPECT_NE(detail.find("32 of 32 threads"), std::string::npos) << detail;
  // Sticky, like the race it stands for would corrupt the results of every later step.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
}

// The emulated device reports compute capability 8.0 unless a test (or KVSCOPE_EMU_CC)
// asks for another; the setting survives cudaDeviceReset.
TEST_F(EmuRuntime, ComputeCapabilityCanBeSet) {
  const int before = kvscope::emu::compute_capability();
  kvscope::emu::set_compute_capability(90);
  cudaDeviceReset();
  cudaDeviceProp prop;
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  kvscope::emu::set_compute_capability(86);
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(prop.major, 8);
  EXPECT_EQ(prop.minor, 6);
  kvscope::emu::set_compute_capability(before);
}

// ---- cuBLAS -------------------------------------------------------------------------

// Column-major reference: C = alpha op(A) op(B) + beta C.
void ref_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& A,
              int lda, const std::vector<float>& B, int ldb, float beta, std::vector<float>& C,
              int ldc) {
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double a = ta ? A[p + i * lda] : A[i + p * lda];
        const double b = tb ? B[j + p * ldb] : B[p + j * ldb];
        acc += a * b;
      }
      C[i + j * ldc] = static_cast<float>(alpha * acc + (beta != 0 ? beta * C[i + j * ldc] : 0));
    }
}

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

TEST_F(EmuRuntime, GemmExMatchesReferenceForAllTransposes) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int m = 13, n = 7, k = 19;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 2, ldc = m + 5;
      std::vector<float> A(lda * (ta ? m : k)), B(ldb * (tb ? k : n)), C(ldc * n);
      std::vector<__half> Ah(A.size()), Bh(B.size());
      for (size_t i = 0; i < A.size(); ++i) {
        Ah[i] = __float2half(u(rng));
        A[i] = __half2float(Ah[i]);
      }
      for (size_t i = 0; i < B.size(); ++i) {
        Bh[i] = __float2half(u(rng));
        B[i] = __half2float(Bh[i]);
      }
      for (float& c : C) c = u(rng);
      std::vector<float> ref = C;
      const float alpha = 0.75f, beta = -0.5f;
      ref_gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, ref, ldc);
      __half* dA = to_device(Ah);
      __half* dB = to_device(Bh);
      float* dC = to_device(C);
      ASSERT_EQ(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m,
                             n, k, &alpha, dA, CUDA_R_16F, lda, dB, CUDA_R_16F, ldb, &beta, dC,
                             CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_SUCCESS);
      std::vector<float> out(C.size());
      ASSERT_EQ(cudaMemcpy(out.data(), dC, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < ldc; ++i) {
          // Rows past m (the ldc padding) must be untouched.
          const float want = i < m ? ref[i + j * ldc] : C[i + j * ldc];
          ASSERT_NEAR(out[i + j * ldc], want, 1e-5f) << ta << tb << " " << i << "," << j;
        }
      cudaFree(dA);
      cudaFree(dB);
      cudaFree(dC);
    }
  cublasDestroy(h);
}

TEST_F(EmuRuntime, GemmBetaZeroNeverReadsCAndBatchedStrides) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const int m = 3, n = 2, k = 4, batch = 3;
  std::vector<float> A(m * k * batch), B(k * n * batch);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(i % 7) - 3;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(i % 5) - 2;
  float* dA = to_device(A);
  float* dB = to_device(B);
  float* dC = nullptr;
  ASSERT_EQ(cudaMalloc(&dC, m * n * batch * 4), cudaSuccess);  // 0xFF: NaN
  const float one = 1, zero = 0;
  ASSERT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA,
                                       CUDA_R_32F, m, m * k, dB, CUDA_R_32F, k, k * n, &zero, dC,
                                       CUDA_R_32F, m, m * n, batch, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> out(m * n * batch);
  ASSERT_EQ(cudaMemcpy(out.data(), dC, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int b = 0; b < batch; ++b) {
    std::vector<float> Ab(A.begin() + b * m * k, A.begin() + (b + 1) * m * k);
    std::vector<float> Bb(B.begin() + b * k * n, B.begin() + (b + 1) * k * n);
    std::vector<float> ref(m * n, 0.f);
    ref_gemm(false, false, m, n, k, 1, Ab, m, Bb, k, 0, ref, m);
    for (int i = 0; i < m * n; ++i) EXPECT_EQ(out[b * m * n + i], ref[i]) << b << " " << i;
  }
  cublasDestroy(h);
}

TEST_F(EmuRuntime, GemmArgumentChecksAndUnsupportedTypes) {
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  float *dA, *dB, *dC;
  ASSERT_EQ(cudaMalloc(&dA, 1024), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dB, 1024), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dC, 1024), cudaSuccess);
  const float one = 1, zero = 0;
  auto gemm = [&](cublasOperation_t ta, int m, int n, int k, int lda, int ldb, int ldc,
                  cudaDataType at, cudaDataType ct, cublasComputeType_t comp, const void* A) {
    return cublasGemmEx(h, ta, CUBLAS_OP_N, m, n, k, &one, A, at, lda, dB, at, ldb, &zero, dC, ct,
                        ldc, comp, CUBLAS_GEMM_DEFAULT);
  };
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, dA),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(gemm(CUBLAS_OP_N, -1, 4, 4, 4, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, dA),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 3, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, dA),
            CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(gemm(CUBLAS_OP_T, 4, 4, 5, 4, 5, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, dA),
            CUBLAS_STATUS_INVALID_VALUE);  // transposed: lda < k
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 4, 4, 3, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, dA),
            CUBLAS_STATUS_INVALID_VALUE);  // ldc < m
  // CONJG is declared but not supported (a value outside the enum's range would be
  // undefined behaviour in the caller, not an argument cuBLAS can check).
  EXPECT_EQ(gemm(CUBLAS_OP_CONJG, 4, 4, 4, 4, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                 dA),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, CUDA_R_32F, CUDA_R_16F, CUBLAS_COMPUTE_32F, dA),
            CUBLAS_STATUS_NOT_SUPPORTED);  // fp32 inputs into an fp16 C
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_16F, dA),
            CUBLAS_STATUS_NOT_SUPPORTED);  // compute 16F needs C in 16F
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, CUDA_R_8I, CUDA_R_32F, CUBLAS_COMPUTE_64F, dA),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dA, CUDA_R_32F, 4, dB,
                         CUDA_R_32F, 4, &zero, dC, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_INITIALIZED);
  // A host matrix is not device memory: execution fails like a faulting kernel.
  std::vector<float> host(16, 1.f);
  EXPECT_EQ(gemm(CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F,
                 host.data()),
            CUBLAS_STATUS_EXECUTION_FAILED);
  cublasDestroy(h);
}

}  // namespace
