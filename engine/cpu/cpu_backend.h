// cpu_backend.h — the CPU implementation of Backend (multi-threaded, SIMD where the
// build machine has it). Weights are used in place from the mapped model file.
#pragma once

#include <memory>

#include "engine/backend.h"

namespace kvscope {

// n_threads <= 0 picks the number of hardware threads.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace kvscope
