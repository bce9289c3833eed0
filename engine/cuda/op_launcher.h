// op_launcher.h — the one way the CUDA backend issues a kernel: OpLauncher::run(what, fn,
// args...) calls the kernels/ entry point fn(args..., stream) now, or, while a decode step
// is being recorded (decode_graph.h), records that call with the key {fn, args...}. The
// launch and its graph key come from the same argument list, so a key can never miss an
// argument: two recorded steps replay one graph only when every entry point and every
// argument (pointers, shapes, scalars, the cache layout) are equal.
//
// Arguments must be keyable: pointers, integers, enums, floats (by bit pattern), QMatrix,
// KvLayer, RopeArgs, ResidualArgs and QkvPost (every field); anything else is a compile error.
// Values that change from step to step (token, position) are passed as device pointers
// (DecodeGraph::params), and the plain value argument is then 0, so the key stays the same.
//
// Programmatic dependent launch (sm_90+, kernels/launch.cuh): when the backend turned it
// on, every call runs inside a ProgrammaticLaunchScope, eagerly, at a recorded step's
// eager flush and while the step is captured into a graph alike, so every kernel of the
// decode path carries the attribute. That is safe because every kernel waits for the
// previous grid first (cuda_compat.cuh); the device sampler's kernels (cuda_sampling.cpp)
// open the same scope. What else the backend issues outside this launcher is not
// relaxed: cuBLAS kernels (prefill GEMMs) and the weights' dequantization launch
// without the attribute and so wait for all earlier work, and the copies, memsets and
// event records between kernels keep full stream order; a kernel after any of them waits
// for it too.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/cuda/cuda_util.h"
#include "engine/cuda/decode_graph.h"
#include "kernels/kernels.h"

namespace kvscope {

class OpLauncher {
 public:
  OpLauncher(DecodeGraph& graph, cudaStream_t stream, bool programmatic)
      : graph_(graph), stream_(stream), programmatic_(programmatic) {}

  template <class... P, class... A>
  Status run(const char* what, cudaError_t (*fn)(P...), A... args) {
    static_assert(sizeof...(P) == sizeof...(A) + 1, "pass every argument but the stream");
    cudaStream_t st = stream_;
    const bool pdl = programmatic_;
    DecodeGraph::Launch call = [fn, args..., st, pdl] {
      kvscope::cuda::ProgrammaticLaunchScope scope(pdl);
      return fn(args..., st);
    };
    if (!graph_.recording()) return cuda_check(call(), what);
    std::vector<int64_t> key{int64_t(reinterpret_cast<uintptr_t>(fn))};
    (put(key, args), ...);
    graph_.add(std::move(key), std::move(call));
    return Status::Ok();
  }

 private:
  template <class A>
  static void put(std::vector<int64_t>& k, const A& a) {
    if constexpr (std::is_pointer_v<A>) {
      k.push_back(int64_t(reinterpret_cast<uintptr_t>(a)));
    } else if constexpr (std::is_null_pointer_v<A>) {
      k.push_back(0);
    } else if constexpr (std::is_enum_v<A> || std::is_integral_v<A>) {
      k.push_back(int64_t(a));
    } else if constexpr (std::is_same_v<A, float>) {
      uint32_t b;
      std::memcpy(&b, &a, 4);
      k.push_back(int64_t(b));
    } else if constexpr (std::is_same_v<A, kvscope::cuda::QMatrix>) {
      for (int64_t w : {int64_t(reinterpret_cast<uintptr_t>(a.data)), int64_t(a.type), a.n_in,
                        a.n_out, a.row_bytes})
        k.push_back(w);
    } else if constexpr (std::is_same_v<A, kvscope::cuda::KvLayer>) {
      for (int64_t w :
           {int64_t(reinterpret_cast<uintptr_t>(a.k)), int64_t(reinterpret_cast<uintptr_t>(a.v)),
            int64_t(a.k_type), int64_t(a.v_type), int64_t(a.n_head_kv), int64_t(a.head_dim),
            int64_t(a.n_slots), int64_t(a.sink), int64_t(a.window),
            int64_t(reinterpret_cast<uintptr_t>(a.pos)), int64_t(a.stride),
            int64_t(reinterpret_cast<uintptr_t>(a.blocks)), int64_t(a.block)})
        k.push_back(w);
    } else if constexpr (std::is_same_v<A, kvscope::cuda::RopeArgs>) {
      put(k, a.n_rot);
      put(k, a.neox);
      put(k, a.base);
      put(k, a.freq_scale);
    } else if constexpr (std::is_same_v<A, kvscope::cuda::ResidualArgs>) {
      put(k, a.x);
      put(k, a.y);
      put(k, a.y_norm);
      put(k, a.w);
      put(k, a.h);
      put(k, a.C);
      put(k, a.eps);
    } else if constexpr (std::is_same_v<A, kvscope::cuda::QkvPost>) {
      for (const float* p : {a.bq, a.bk, a.bv, a.q_norm, a.k_norm}) put(k, p);
      put(k, a.H);
      put(k, a.rope);
      put(k, a.pos0);
      put(k, a.pos0_dev);
      put(k, a.k_row_norm);
      put(k, a.v_row_norm);
    } else {
      static_assert(sizeof(A) == 0, "add this argument type to OpLauncher::put");
    }
  }

  DecodeGraph& graph_;
  cudaStream_t stream_;
  bool programmatic_;
};

}  // namespace kvscope
