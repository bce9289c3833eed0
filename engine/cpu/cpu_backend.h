// cpu_backend.h — the CPU implementation of Backend (multi-threaded, SIMD where the
// build machine has it). Weights are used in place from the mapped model file.
#pragma once

#include <memory>
#include <string>

#include "engine/backend.h"
#include "common/status.h"

namespace kvscope {

// The CPU backend with n_threads threads (<= 0: one per hardware thread). More threads
// than the hardware runs at once only slow every step down, so a larger request is
// clamped to hardware_threads() and *notice (when given) receives a one-line note saying
// so. An error when the system refuses to start the threads.
Expected<std::unique_ptr<Backend>> create_cpu_backend(int n_threads, std::string* notice = nullptr);
// Exactly n_threads threads (<= 0: one per hardware thread), for tests that want a given
// partition; when threads cannot be started it runs with the ones that did.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace kvscope
