// emu_internal.h — shared state between the emulator's runtime, scheduler and cuBLAS.
// Not included by kernels.
#pragma once

#include <functional>
#include <string>

#include "kernels/emu/emu.h"

namespace kvscope::emu {

// Records the outcome of an API call as the last error. Sticky errors (a faulting or
// deadlocked kernel) are returned by every later call until cudaDeviceReset.
cudaError_t record(cudaError_t e, const std::string& detail = {}, bool sticky = false);
cudaError_t sticky_error();

bool stream_valid(cudaStream_t s);
// When s is being captured into a graph, queues op and returns true.
bool capture_if_capturing(cudaStream_t s, std::function<cudaError_t()> op);
size_t max_dynamic_smem(const void* func);

// Runs every block of the grid; on failure returns the error and fills *detail.
// *all_waited: every thread of every block called grid_dependency_wait(). A programmatic
// launch (spec.programmatic) in which a thread exits without it fails. A cooperative launch
// (spec.cooperative) runs every block at once, each on its own OS thread.
cudaError_t run_grid(const LaunchSpec& spec, const std::function<void()>& body, std::string* detail,
                     bool* all_waited);

}  // namespace kvscope::emu
