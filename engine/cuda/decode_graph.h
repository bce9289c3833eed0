// decode_graph.h — records the kernel launches of one decode step (T = 1) and replays
// them as a CUDA graph when a later step issues the same launches.
//
// How a step goes: the backend calls begin(token) from embed(); every op it then issues
// is add()ed as a key (the op's kernel and every argument that does not change from
// step to step: pointers, shapes, scalars) plus a closure that launches it. Arguments
// that do change (the token id and the position pos0) are not in the closures: kernels
// read them from the small device struct params() points to. flush() (called before
// anything that needs the results, e.g. download) copies {token, pos0} to the device
// with one cudaMemcpyAsync and then either launches the cached graph whose key sequence
// equals this step's, or captures the closures into a new graph and launches that, or
// (when the step was marked not graphable) runs the closures directly on the stream.
// Correctness never depends on a graph being used: the closures are the same either
// way; a changed pointer (the cache grew, a scratch slot moved) gives a new key.
//
// Batched decode steps (B decode rows of B sequences, B <= kMaxStepRows) record the same
// way: their per-step values (the B token ids, the rows ops' per-row cache references
// with each row's position) are stage()d into a host mirror of the step's device area,
// right after Params, at offsets that depend only on what was staged before in the step;
// flush() uploads Params and everything staged in one copy. So the step's launches read
// fixed device addresses and two steps of the same B replay one graph.
//
// Graphs are keyed by the exact launch sequence, hence by the exact B (not by a padded
// bucket): padding B up to 1, 2, 4, ..., 64 would make every op of the forward (norms,
// products, elementwise ops, scratch sizes, the LM head) run over rows no sequence owns,
// while exact B keeps the recorded launches the eager ones. The cost is one capture per
// batch size met; kMaxGraphs = 16 keeps the single-sequence graph and a working set of
// batch sizes as sequences come and go (least recently used evicted).
//
// Ownership: owns its graphs (at most kMaxGraphs, oldest evicted) and the device params.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"

namespace kvscope {

class DecodeGraph {
 public:
  // Device-side per-step values read by the recorded kernels.
  struct Params {
    int32_t token = 0;
    int32_t pos0 = 0;
  };
  using Launch = std::function<cudaError_t()>;
  // The most rows a recorded step may have (a batched decode step of up to 64 sequences).
  static constexpr int kMaxStepRows = 64;

  DecodeGraph() = default;
  DecodeGraph(const DecodeGraph&) = delete;
  DecodeGraph& operator=(const DecodeGraph&) = delete;
  ~DecodeGraph();

  // staged_bytes: room for stage()d per-step values (besides Params).
  Status init(cudaStream_t stream, size_t staged_bytes = 0);
  bool recording() const { return recording_; }
  void begin(int32_t token);
  // Copies `bytes` of per-step values into this step's upload (16-byte aligned, after
  // what was staged before) and returns where the kernels find them on the device;
  // nullptr while not recording or when the area is full (the caller then flush()es and
  // issues its op eagerly).
  const void* stage(const void* src, size_t bytes);
  // Counts begin() calls: identifies the step being recorded.
  uint64_t step_serial() const { return serial_; }
  // The step's position: the first call sets it; a different value marks the step as
  // not graphable (its closures would read the wrong pos0) and returns false.
  bool use_pos0(int pos0);
  void add(std::vector<int64_t> key, Launch launch);
  // Marks the step as one that must run without a graph (still correct, just eager).
  void not_graphable() { graphable_ = false; }
  Status flush();

  const int32_t* token_dev() const { return &params_dev_->token; }
  const int* pos0_dev() const { return &params_dev_->pos0; }

  // Counters (for tests and benchmarks).
  int captures() const { return captures_; }
  int replays() const { return replays_; }
  int eager_steps() const { return eager_steps_; }

 private:
  static constexpr size_t kMaxGraphs = 16;
  struct Cached {
    std::vector<int64_t> key;
    cudaGraphExec_t exec = nullptr;
  };
  Status run_eagerly();

  cudaStream_t stream_ = nullptr;
  Params* params_dev_ = nullptr;  // Params, then the staged values: cap_ bytes
  Params params_host_;
  std::vector<unsigned char> staged_;  // host mirror of the staged values
  size_t cap_ = 0, used_ = 0;          // staged area: capacity and bytes used this step
  uint64_t serial_ = 0;
  bool recording_ = false;
  bool graphable_ = true;
  bool have_pos0_ = false;
  std::vector<int64_t> key_;
  std::vector<Launch> launches_;
  std::vector<Cached> graphs_;  // most recently used last
  int captures_ = 0, replays_ = 0, eager_steps_ = 0;
};

}  // namespace kvscope
