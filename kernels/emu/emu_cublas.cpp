// emu_cublas.cpp — the cuBLAS subset the CUDA backend uses, on the CPU.
//
// cublasGemmEx / cublasGemmStridedBatchedEx with exact column-major semantics:
// C = alpha * op(A) * op(B) + beta * C, op(A) m x k, op(B) k x n, C m x n, element (i, j)
// of a column-major matrix X at X[i + j * ldX]. Accumulation in double, one rounding
// to the C type. beta == 0 never reads C. Arguments are checked like the library
// documents (INVALID_VALUE for sizes/leading dimensions/transposes, NOT_SUPPORTED for
// type combinations outside the table below); pointer mode is host.
#include <cublas_v2.h>

#include <vector>

#include "kernels/emu/emu_internal.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

double load(cudaDataType t, const void* p, size_t i) {
  switch (t) {
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_32F: return static_cast<const float*>(p)[i];
    case CUDA_R_64F: return static_cast<const double*>(p)[i];
    default: return 0;
  }
}

void store(cudaDataType t, void* p, size_t i, double v) {
  switch (t) {
    case CUDA_R_16F: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); break;
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
    case CUDA_R_32F: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case CUDA_R_64F: static_cast<double*>(p)[i] = v; break;
    default: break;
  }
}

size_t type_bytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_32F: return 4;
    case CUDA_R_64F: return 8;
    default: return 0;
  }
}

// Scale type (alpha/beta) of a supported (compute, A, B, C) combination, or -1.
int scale_type(cublasComputeType_t compute, cudaDataType a, cudaDataType b, cudaDataType c) {
  if (a != b) return -1;
  switch (compute) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
      return (a == CUDA_R_16F && c == CUDA_R_16F) ? CUDA_R_16F : -1;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      if (a == CUDA_R_32F && c == CUDA_R_32F) return CUDA_R_32F;
      if ((a == CUDA_R_16F || a == CUDA_R_16BF) && (c == a || c == CUDA_R_32F)) return CUDA_R_32F;
      return -1;
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
      return (a == CUDA_R_32F && c == CUDA_R_32F) ? CUDA_R_32F : -1;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
      return (a == CUDA_R_64F && c == CUDA_R_64F) ? CUDA_R_64F : -1;
    default: return -1;
  }
}

bool valid_op(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

// Bytes spanned by a column-major rows x cols matrix with leading dimension ld.
size_t span_bytes(int rows, int cols, int ld, size_t elem) {
  if (rows == 0 || cols == 0) return 0;
  return (size_t(cols - 1) * size_t(ld) + size_t(rows)) * elem;
}

struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  double alpha, beta;
  const void* a;
  cudaDataType at;
  int lda;
  long long sa;
  const void* b;
  cudaDataType bt;
  int ldb;
  long long sb;
  void* c;
  cudaDataType ct;
  int ldc;
  long long sc;
  int batch;
};

void run_gemm(const Gemm& g) {
  std::vector<double> arow(g.k);
  for (int bi = 0; bi < g.batch; ++bi) {
    const size_t oa = size_t(bi) * g.sa, ob = size_t(bi) * g.sb, oc = size_t(bi) * g.sc;
    for (int i = 0; i < g.m; ++i) {
      for (int p = 0; p < g.k; ++p) {
        const size_t idx = g.ta == CUBLAS_OP_N ? size_t(i) + size_t(p) * g.lda
                                               : size_t(p) + size_t(i) * g.lda;
        arow[p] = load(g.at, g.a, oa + idx);
      }
      for (int j = 0; j < g.n; ++j) {
        double acc = 0;
        if (g.alpha != 0) {
          for (int p = 0; p < g.k; ++p) {
            const size_t idx = g.tb == CUBLAS_OP_N ? size_t(p) + size_t(j) * g.ldb
                                                   : size_t(j) + size_t(p) * g.ldb;
            acc += arow[p] * load(g.bt, g.b, ob + idx);
          }
        }
        const size_t ci = oc + size_t(i) + size_t(j) * g.ldc;
        double v = g.alpha * acc;
        if (g.beta != 0) v += g.beta * load(g.ct, g.c, ci);
        store(g.ct, g.c, ci, v);
      }
    }
  }
}

cublasStatus_t gemm_checked(cublasHandle_t h, Gemm g, const void* alpha, const void* beta,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_op(g.ta) || !valid_op(g.tb) || g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 ||
      !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  const int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k;
  const int b_rows = g.tb == CUBLAS_OP_N ? g.k : g.n;
  if (g.lda < std::max(1, a_rows) || g.ldb < std::max(1, b_rows) || g.ldc < std::max(1, g.m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!(algo == CUBLAS_GEMM_DEFAULT || algo == CUBLAS_GEMM_DEFAULT_TENSOR_OP ||
        (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
        (algo >= CUBLAS_GEMM_ALGO0_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP)))
    return CUBLAS_STATUS_INVALID_VALUE;
  const int st = scale_type(compute, g.at, g.bt, g.ct);
  if (st < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (kvscope::emu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;
  g.alpha = load(cudaDataType(st), alpha, 0);
  g.beta = load(cudaDataType(st), beta, 0);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;

  // Every matrix the call reads or writes must be device memory (a GPU would fault).
  const int a_cols = g.ta == CUBLAS_OP_N ? g.k : g.m;
  const int b_cols = g.tb == CUBLAS_OP_N ? g.n : g.k;
  const bool reads_ab = g.k > 0 && g.alpha != 0;
  auto batch_span = [&](int rows, int cols, int ld, long long stride, cudaDataType t) {
    return span_bytes(rows, cols, ld, type_bytes(t)) +
           size_t(g.batch - 1) * size_t(stride < 0 ? 0 : stride) * type_bytes(t);
  };
  if ((reads_ab && (!kvscope::emu::is_device_range(g.a, batch_span(a_rows, a_cols, g.lda, g.sa, g.at)) ||
                    !kvscope::emu::is_device_range(g.b, batch_span(b_rows, b_cols, g.ldb, g.sb, g.bt)))) ||
      !kvscope::emu::is_device_range(g.c, batch_span(g.m, g.n, g.ldc, g.sc, g.ct))) {
    kvscope::emu::record(cudaErrorIllegalAddress,
                        "cuBLAS GEMM: a matrix argument is not a device range inside one "
                        "cudaMalloc allocation",
                        true);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (!reads_ab) g.k = 0;
  if (kvscope::emu::capture_if_capturing(h->stream, [g] {
        run_gemm(g);
        return cudaSuccess;
      }))
    return CUBLAS_STATUS_SUCCESS;
  run_gemm(g);
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!kvscope::emu::stream_valid(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!stream) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  Gemm g{transa, transb, m, n, k, 0, 0, A, Atype, lda, 0, B, Btype, ldb, 0, C, Ctype, ldc, 0, 1};
  return gemm_checked(handle, g, alpha, beta, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
    const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  Gemm g{transa, transb, m, n, k, 0, 0, A, Atype, lda, strideA, B, Btype, ldb, strideB,
         C, Ctype, ldc, strideC, batchCount};
  return gemm_checked(handle, g, alpha, beta, computeType, algo);
}
