// cuda_backend.h — the CUDA implementation of Backend (kernels in kernels/, cuBLAS for
// long matmuls) and device detection.
//
// The same sources build against the real CUDA runtime (library kvscope_cuda) and
// against the CPU emulation layer (kvscope_cuda_emu, used by the parity tests). All
// CUDA and cuBLAS failures come back as kvscope::Error; nothing aborts.
#pragma once

#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/model.h"
#include "common/status.h"

namespace kvscope {

struct CudaDeviceInfo {
  int device = 0;
  std::string name;         // e.g. "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  uint64_t total_bytes = 0;
};

// Finds a usable GPU. No driver, no device, or a failing runtime is an Error whose
// message says so and suggests the CPU backend; never a crash.
Expected<CudaDeviceInfo> cuda_probe(int device = 0);

struct CudaBackendOptions {
  int device = 0;
  // Matmuls over more than this many tokens use cuBLAS (fp32) on an fp32 copy of the
  // weight; up to it, the matvec kernels (decode is T = 1).
  int matvec_max_tokens = 8;
  // Matmuls over more rows than matvec_max_tokens, up to this many, use the batched
  // quantized GEMM (kernels/matmul_batched.cu) on the weight as stored: a batched decode
  // step of up to 64 sequences reads the quantized bytes once per step and needs no fp32
  // copy. 64 is one activation tile of that kernel: every W tile is decoded once for all
  // rows; past it each further 64 rows decode W again, and long prefills (compute-bound)
  // are better served by cuBLAS on the fp32 copy. It is also the largest graphed batch.
  int batched_max_tokens = 64;
  // The batched GEMM splits a matrix of few 64-row tiles over about this many blocks
  // (matmul_batched_splits); KVSCOPE_CUDA_GEMM_BLOCKS=N in the environment sets it, for
  // measuring the choice on a GPU. 256 (two blocks per multiprocessor of an H100) beat
  // 128 and 64 there at batch 16 and 64 (docs/performance.md).
  int batched_target_blocks = 256;
  // Decode steps (T = 1, and batched decode steps of up to batched_max_tokens rows) are
  // recorded and replayed as a CUDA graph (engine/cuda/decode_graph.h): one graph launch
  // instead of ~9 kernel launches per layer.
  bool decode_graph = true;
  // Programmatic dependent launch between the kernels (engine/cuda/op_launcher.h): each
  // kernel may start while the previous one finishes, waiting in its first statement for
  // that kernel's results. Used where the device has compute capability 9.0 or more, the
  // runtime and driver are CUDA 12.3 or newer (graphs capture it) and the kernels were
  // built for compute_90 or newer; KVSCOPE_CUDA_PDL=0 in the environment turns it off.
  // On such devices the backend's name() ends in ", PDL on" or ", PDL off".
  bool programmatic_launch = true;
};

// Uploads every weight of `model` once and creates the stream, cuBLAS handle and timing
// events. The model must outlive the backend (its weight pointers identify uploads).
Expected<std::unique_ptr<Backend>> make_cuda_backend(const Model& model,
                                                     const CudaBackendOptions& options = {});

}  // namespace kvscope
