// kernel_test_util.h — helpers for running kernels under the CUDA emulator in tests:
// device buffers that free themselves, host<->device copies, random data, and a
// comparison that reports the first mismatches (index, got, want).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/quant.h"
#include "kernels/kernels.h"

namespace kvscope::test {

template <class T>
struct DevVec {
  T* p = nullptr;
  size_t n = 0;
  explicit DevVec(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, count) * sizeof(T)), cudaSuccess);
  }
  explicit DevVec(const std::vector<T>& h) : DevVec(h.size()) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DevVec(const DevVec&) = delete;
  ~DevVec() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

// |got - want| <= abs_tol + rel_tol * |want| for every element; prints up to 5 failures.
inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& want, float abs_tol,
                                            float rel_tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  int bad = 0;
  auto r = ::testing::AssertionFailure();
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = abs_tol + rel_tol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      if (bad < 5) r << "[" << i << "] got " << got[i] << " want " << want[i] << "; ";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return r << bad << " of " << got.size() << " outside tolerance";
}

// A cache layer over test buffers: both sides f16 or f32, a full layout (slot = position
// below n_slots) unless window > 0 makes it a ring of n_slots with that window.
inline kvscope::cuda::KvLayer kv_layer(void* k, void* v, bool f16, int Hkv, int D, int n_slots,
                                      int32_t* pos, int window = 0) {
  kvscope::cuda::KvLayer l;
  l.k = k;
  l.v = v;
  l.k_type = l.v_type = f16 ? kvscope::cuda::KvElem::F16 : kvscope::cuda::KvElem::F32;
  l.n_head_kv = Hkv;
  l.head_dim = D;
  l.n_slots = n_slots;
  l.window = window;
  l.pos = pos;
  return l;
}

// The first n values of a KV cache side on the device, as fp32 (f16 or f32 storage).
inline std::vector<float> read_cache(const DevVec<uint8_t>& side, bool f16, size_t n) {
  const auto raw = side.get();
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (f16) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = kvscope::fp16_to_fp32(h);
    } else {
      std::memcpy(&out[i], raw.data() + 4 * i, 4);
    }
  }
  return out;
}

}  // namespace kvscope::test
