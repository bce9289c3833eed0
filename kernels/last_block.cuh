// last_block.cuh — "the last block to finish does the epilogue": the kernels that finish a
// decode-step op in the same launch (attention's merge, the fused products' residual
// write and reductions) count finished blocks on a device counter.
//
// Invariants: the counter is zero before the launch and the last block puts it back to
// zero, so a recorded graph can replay the launch; every thread of the block calls
// last_block_to_arrive (it holds barriers); the epilogue never depends on which block came
// last, only on the data all of them wrote (results stay deterministic).
#pragma once

#include "kernels/cuda_compat.cuh"

namespace kvscope::cuda {

// Whether this block is the last of `count` to arrive at *counter (block-uniform); the
// last one resets the counter for the next launch. Every thread's global writes before
// the call are visible to the last block after it. flag: one int of shared memory.
__device__ __forceinline__ bool last_block_to_arrive(unsigned* counter, unsigned count, int* flag) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned ticket = atomicAdd(counter, 1u);
    *flag = ticket == count - 1 ? 1 : 0;
    if (*flag) atomicExch(counter, 0u);
  }
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

}  // namespace kvscope::cuda
