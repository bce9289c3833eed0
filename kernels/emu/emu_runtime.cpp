// emu_runtime.cpp — the CUDA runtime API subset, defined against NVIDIA's prototypes.
//
// Device memory is host memory registered in an allocation table: new allocations are
// filled with 0xFF (NaN for floats) so reads of unwritten memory show up; copies check
// that device ranges lie inside one live allocation and that the direction matches the
// kind. Every allocation is followed by guard bytes, from the requested size (not the
// 256-byte rounding) on: under AddressSanitizer they are poisoned, so the faulting access
// itself is reported; otherwise they hold a pattern that is checked after every kernel
// and at cudaFree, and a changed byte fails the launch with cudaErrorIllegalAddress. Streams run synchronously; events record host timestamps; graphs replay the
// operations captured from a stream. The last error follows the real rules: most
// errors are cleared by cudaGetLastError, a failed kernel is sticky until
// cudaDeviceReset.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "kernels/emu/emu_internal.h"
#include "kernels/emu/emu_sanitizer.h"

struct CUstream_st {
  bool capturing = false;
  std::vector<std::function<cudaError_t()>> captured;
};
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point t;
};
struct CUgraph_st {
  std::vector<std::function<cudaError_t()>> ops;
};
struct CUgraphExec_st {
  std::vector<std::function<cudaError_t()>> ops;
};

namespace kvscope::emu {
namespace {

constexpr size_t kDeviceBytes = size_t(8) << 30;  // what the emulated device reports
constexpr size_t kDefaultSmem = 48 * 1024;
constexpr size_t kOptinSmem = 227 * 1024;
constexpr size_t kAllocAlign = 256;     // what cudaMalloc guarantees
constexpr size_t kAllocGuardBytes = 256;  // past the 256-byte rounding, at least

struct State {
  std::mutex mu;
  std::map<uintptr_t, size_t> allocs;  // base -> bytes
  size_t allocated = 0;
  std::set<cudaStream_t> streams;
  std::set<cudaEvent_t> events;
  std::map<const void*, size_t> func_smem;
  cudaError_t last = cudaSuccess;
  cudaError_t sticky = cudaSuccess;
  std::string detail;
};

State& st() {
  static State* s = new State;  // never destroyed: usable from static destructors
  return *s;
}

// Allocation containing [p, p+bytes), or allocs.end(). Caller holds the lock.
std::map<uintptr_t, size_t>::const_iterator find_alloc(const void* p, size_t bytes) {
  auto& a = st().allocs;
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = a.upper_bound(u);
  if (it == a.begin()) return a.end();
  --it;
  if (u >= it->first && u - it->first <= it->second && bytes <= it->second - (u - it->first) &&
      (bytes > 0 || u - it->first < it->second || it->second == 0))
    return it;
  return a.end();
}

bool is_device_any(const void* p) {
  std::lock_guard<std::mutex> lk(st().mu);
  return find_alloc(p, 0) != st().allocs.end();
}

std::string ptr_str(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Bytes held for a `size`-byte allocation: the 256-byte rounding plus the guard.
size_t padded_bytes(size_t size) {
  return (size + kAllocAlign - 1) / kAllocAlign * kAllocAlign + kAllocGuardBytes;
}
// Guard byte k past the end of an allocation: varies with k, so a kernel that stores a
// constant past the end cannot restore it by accident.
uint8_t guard_byte(size_t k) { return static_cast<uint8_t>(0xA5u ^ (k * 0x3Bu)); }

void arm_guard(unsigned char* m, size_t size) {
  const size_t n = padded_bytes(size) - size;
  for (size_t k = 0; k < n; ++k) m[size + k] = guard_byte(k);
  emu_poison(m + size, n);
}

void free_guarded(void* m, size_t size) {
  emu_unpoison(m, padded_bytes(size));
  std::free(m);
}

// First changed guard byte (its offset past the end), or -1. Under ASan the guard is
// poisoned and the access that would change it has been reported already.
int64_t damaged_guard(const void* m, size_t size) {
  if (kAsan) return -1;
  const auto* g = static_cast<const unsigned char*>(m) + size;
  const size_t n = padded_bytes(size) - size;
  for (size_t k = 0; k < n; ++k)
    if (g[k] != guard_byte(k)) return static_cast<int64_t>(k);
  return -1;
}

std::string overrun_report(uintptr_t base, size_t size, int64_t k) {
  return "a write past the end of the " + std::to_string(size) + "-byte device allocation at " +
         ptr_str(reinterpret_cast<const void*>(base)) + " changed byte " + std::to_string(size + k) +
         " (" + std::to_string(k + 1) + " past its end)";
}

// Checks every live allocation's guard; the caller holds the lock. "" when all intact.
std::string check_all_guards() {
  for (const auto& [base, size] : st().allocs) {
    const int64_t k = damaged_guard(reinterpret_cast<const void*>(base), size);
    if (k >= 0) return overrun_report(base, size, k);
  }
  return {};
}

cudaError_t check_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  const bool dst_dev = is_device_range(dst, n), src_dev = is_device_range(src, n);
  const bool dst_in = is_device_any(dst), src_in = is_device_any(src);
  auto bad = [&](const std::string& why) {
    return record(cudaErrorInvalidValue, "cudaMemcpy of " + std::to_string(n) + " bytes from " +
                                             ptr_str(src) + " to " + ptr_str(dst) + ": " + why);
  };
  switch (kind) {
    case cudaMemcpyHostToDevice:
      if (!dst_dev) return bad("destination is not a device range inside one allocation");
      if (src_in) return bad("source is device memory but the kind says host");
      break;
    case cudaMemcpyDeviceToHost:
      if (!src_dev) return bad("source is not a device range inside one allocation");
      if (dst_in) return bad("destination is device memory but the kind says host");
      break;
    case cudaMemcpyDeviceToDevice:
      if (!dst_dev || !src_dev) return bad("both ranges must lie inside device allocations");
      break;
    case cudaMemcpyHostToHost:
      if (dst_in || src_in) return bad("a device pointer was passed with cudaMemcpyHostToHost");
      break;
    case cudaMemcpyDefault:
      if ((dst_in && !dst_dev) || (src_in && !src_dev))
        return bad("a device range runs past the end of its allocation");
      break;
    default:
      return bad("unknown cudaMemcpyKind " + std::to_string(int(kind)));
  }
  if (n && (!dst || !src)) return bad("null pointer");
  return cudaSuccess;
}

}  // namespace

cudaError_t record(cudaError_t e, const std::string& detail, bool sticky) {
  std::lock_guard<std::mutex> lk(st().mu);
  if (e != cudaSuccess) {
    st().last = e;
    st().detail = detail;
    if (sticky) st().sticky = e;
  }
  return e;
}

cudaError_t sticky_error() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().sticky;
}

std::string last_error_detail() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().detail;
}

bool is_device_range(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(st().mu);
  return find_alloc(p, bytes) != st().allocs.end();
}

bool stream_valid(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lk(st().mu);
  return st().streams.count(s) != 0;
}

bool capture_if_capturing(cudaStream_t s, std::function<cudaError_t()> op) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return false;
  if (!s->capturing) return false;
  s->captured.push_back(std::move(op));
  return true;
}

std::atomic<uint64_t> g_direct_launches{0}, g_graph_launches{0}, g_kernels_run{0},
    g_bytes_to_device{0}, g_bytes_to_host{0}, g_graphs_instantiated{0}, g_programmatic_run{0},
    g_all_waited{0}, g_cooperative_run{0}, g_host_copies_to_device{0}, g_allocations{0};

// KVSCOPE_EMU_CC: "90" or "9.0"; anything unreadable or out of range keeps 8.0.
std::atomic<int> g_cc{[] {
  const char* e = std::getenv("KVSCOPE_EMU_CC");
  if (!e || !*e) return 80;
  int major = 0, minor = 0;
  if (std::sscanf(e, "%d.%d", &major, &minor) == 2) return major * 10 + minor;
  const int v = std::atoi(e);
  return v >= 10 && v < 200 ? v : 80;
}()};

void set_compute_capability(int cc) {
  g_cc = cc;
}
int compute_capability() {
  return g_cc.load();
}

uint64_t direct_kernel_launches() { return g_direct_launches.load(); }
uint64_t graph_launches() { return g_graph_launches.load(); }
uint64_t graphs_instantiated() { return g_graphs_instantiated.load(); }
uint64_t kernels_run() { return g_kernels_run.load(); }
uint64_t bytes_to_device() { return g_bytes_to_device.load(); }
uint64_t bytes_to_host() { return g_bytes_to_host.load(); }
uint64_t host_copies_to_device() {
  return g_host_copies_to_device.load();
}
uint64_t device_allocations() {
  return g_allocations.load();
}
uint64_t programmatic_kernels_run() {
  return g_programmatic_run.load();
}
uint64_t kernels_all_waited() {
  return g_all_waited.load();
}
uint64_t cooperative_kernels_run() {
  return g_cooperative_run.load();
}

// Counts a copy that runs now (check_copy accepted it); `direct`: the host's own call, not
// a captured copy replayed with its graph (each direct call to the device costs the host a
// driver round trip on a GPU).
static void count_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool direct) {
  const bool to_dev = kind == cudaMemcpyHostToDevice ||
                      (kind == cudaMemcpyDefault && is_device_any(dst) && !is_device_any(src));
  const bool to_host = kind == cudaMemcpyDeviceToHost ||
                       (kind == cudaMemcpyDefault && is_device_any(src) && !is_device_any(dst));
  if (to_dev) g_bytes_to_device += n;
  if (to_host) g_bytes_to_host += n;
  if (to_dev && direct) ++g_host_copies_to_device;
}

size_t max_dynamic_smem(const void* func) {
  std::lock_guard<std::mutex> lk(st().mu);
  auto it = st().func_smem.find(func);
  return it == st().func_smem.end() ? kDefaultSmem : it->second;
}

// Runs the grid (counted), then checks that no allocation's guard bytes changed.
cudaError_t run_grid_checked(const LaunchSpec& spec, const std::function<void()>& body) {
  ++g_kernels_run;
  if (spec.programmatic) ++g_programmatic_run;
  if (spec.cooperative) ++g_cooperative_run;
  std::string d;
  bool all_waited = false;
  cudaError_t e = run_grid(spec, body, &d, &all_waited);
  if (all_waited) ++g_all_waited;
  if (e) return record(e, d, true);
  {
    std::lock_guard<std::mutex> lk(st().mu);
    d = check_all_guards();
  }
  if (!d.empty()) return record(cudaErrorIllegalAddress, "kernel launch: " + d, true);
  return cudaSuccess;
}

cudaError_t launch(const LaunchSpec& spec, std::function<void()> body,
                   const std::string& pointer_problem) {
  if (cudaError_t s = sticky_error()) return s;
  const auto& g = spec.grid;
  const auto& b = spec.block;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  std::string why;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
    why = "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
          std::to_string(b.z) + ") must have 1..1024 threads, x,y <= 1024, z <= 64";
  else if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    why = "grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," +
          std::to_string(g.z) + ") must be 1..2^31-1 in x and 1..65535 in y, z";
  else if (spec.smem > max_dynamic_smem(spec.func))
    why = "dynamic shared memory " + std::to_string(spec.smem) + " B exceeds the kernel's limit " +
          std::to_string(max_dynamic_smem(spec.func)) +
          " B (raise it with cudaFuncSetAttribute up to " + std::to_string(kOptinSmem) + ")";
  if (!why.empty()) return record(cudaErrorInvalidConfiguration, "kernel launch: " + why);
  const uint64_t blocks = uint64_t(g.x) * g.y * g.z;
  if (spec.cooperative && blocks > uint64_t(cooperative_max_blocks(int(threads))))
    return record(cudaErrorCooperativeLaunchTooLarge,
                  "cooperative kernel launch: grid of " + std::to_string(blocks) +
                      " blocks of " + std::to_string(threads) + " threads exceeds the " +
                      std::to_string(cooperative_max_blocks(int(threads))) +
                      " that can be resident at once (size it with "
                      "cudaOccupancyMaxActiveBlocksPerMultiprocessor x multiProcessorCount)");
  if (!stream_valid(spec.stream))
    return record(cudaErrorInvalidResourceHandle, "kernel launch: unknown stream");
  if (!pointer_problem.empty())
    return record(cudaErrorIllegalAddress, "kernel launch: " + pointer_problem, true);
  if (capture_if_capturing(spec.stream, [spec, body] { return run_grid_checked(spec, body); }))
    return cudaSuccess;
  ++g_direct_launches;
  return run_grid_checked(spec, body);
}

}  // namespace kvscope::emu

using kvscope::emu::record;
using kvscope::emu::st;

#define KVSCOPE_EMU_STICKY()                                     \
  do {                                                           \
    if (cudaError_t s_ = kvscope::emu::sticky_error()) return s_; \
  } while (0)

cudaError_t cudaMalloc(void** p, size_t size) {
  KVSCOPE_EMU_STICKY();
  if (!p) return record(cudaErrorInvalidValue, "cudaMalloc: devPtr is null");
  *p = nullptr;
  std::lock_guard<std::mutex> lk(st().mu);
  if (size > kvscope::emu::kDeviceBytes - st().allocated) {
    st().last = cudaErrorMemoryAllocation;
    st().detail = "cudaMalloc: " + std::to_string(size) + " bytes requested, " +
                  std::to_string(kvscope::emu::kDeviceBytes - st().allocated) + " free";
    return cudaErrorMemoryAllocation;
  }
  const size_t padded = kvscope::emu::padded_bytes(size);
  void* m = std::aligned_alloc(kvscope::emu::kAllocAlign, padded);
  if (!m) {
    st().last = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  std::memset(m, 0xFF, size);
  kvscope::emu::arm_guard(static_cast<unsigned char*>(m), size);
  st().allocs[reinterpret_cast<uintptr_t>(m)] = size;
  st().allocated += size;
  ++kvscope::emu::g_allocations;
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  std::lock_guard<std::mutex> lk(st().mu);
  auto it = st().allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == st().allocs.end()) {
    st().last = cudaErrorInvalidValue;
    st().detail = "cudaFree: " + kvscope::emu::ptr_str(p) + " is not the start of a live allocation";
    return cudaErrorInvalidValue;
  }
  const size_t size = it->second;
  const int64_t k = kvscope::emu::damaged_guard(p, size);
  const std::string report = k >= 0 ? kvscope::emu::overrun_report(it->first, size, k) : "";
  st().allocated -= size;
  st().allocs.erase(it);
  kvscope::emu::free_guarded(p, size);
  if (!report.empty()) {
    st().last = cudaErrorIllegalAddress;
    st().detail = "cudaFree: " + report;
    return cudaErrorIllegalAddress;
  }
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t size) {
  if (!p) return record(cudaErrorInvalidValue, "cudaMallocHost: ptr is null");
  *p = std::malloc(size ? size : 1);
  return *p ? cudaSuccess : record(cudaErrorMemoryAllocation, "cudaMallocHost failed");
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  KVSCOPE_EMU_STICKY();
  if (cudaError_t e = kvscope::emu::check_copy(dst, src, n, kind)) return e;
  kvscope::emu::count_copy(dst, src, n, kind, /*direct=*/true);
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  KVSCOPE_EMU_STICKY();
  if (!kvscope::emu::stream_valid(s))
    return record(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: unknown stream");
  if (cudaError_t e = kvscope::emu::check_copy(dst, src, n, kind)) return e;
  if (kvscope::emu::capture_if_capturing(s, [=] {
        kvscope::emu::count_copy(dst, src, n, kind, /*direct=*/false);
        if (n) std::memmove(dst, src, n);
        return cudaSuccess;
      }))
    return cudaSuccess;
  kvscope::emu::count_copy(dst, src, n, kind, /*direct=*/true);
  if (n) std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
  KVSCOPE_EMU_STICKY();
  if (!kvscope::emu::is_device_range(p, n))
    return record(cudaErrorInvalidValue, "cudaMemset: " + kvscope::emu::ptr_str(p) + " + " +
                                             std::to_string(n) + " is not inside an allocation");
  std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  KVSCOPE_EMU_STICKY();
  if (!kvscope::emu::stream_valid(s))
    return record(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: unknown stream");
  if (!kvscope::emu::is_device_range(p, n))
    return record(cudaErrorInvalidValue, "cudaMemsetAsync: range is not inside an allocation");
  if (kvscope::emu::capture_if_capturing(s, [=] {
        std::memset(p, value, n);
        return cudaSuccess;
      }))
    return cudaSuccess;
  std::memset(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lk(st().mu);
  if (free_bytes) *free_bytes = kvscope::emu::kDeviceBytes - st().allocated;
  if (total) *total = kvscope::emu::kDeviceBytes;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return record(cudaErrorInvalidValue, "cudaGetDeviceCount: null");
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess
                     : record(cudaErrorInvalidDevice, "cudaSetDevice: only device 0 exists");
}
cudaError_t cudaGetDevice(int* device) {
  if (device) *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return record(cudaErrorInvalidValue, "cudaGetDeviceProperties: null");
  if (device != 0) return record(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device");
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "kvscope CUDA emulator (CPU)");
  prop->totalGlobalMem = kvscope::emu::kDeviceBytes;
  prop->sharedMemPerBlock = kvscope::emu::kDefaultSmem;
  prop->sharedMemPerBlockOptin = kvscope::emu::kOptinSmem;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = kvscope::emu::compute_capability() / 10;
  prop->minor = kvscope::emu::compute_capability() % 10;
  prop->multiProcessorCount = 1;
  prop->cooperativeLaunch = 1;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v) *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  KVSCOPE_EMU_STICKY();
  return cudaSuccess;
}

cudaError_t cudaDeviceReset() {
  std::lock_guard<std::mutex> lk(st().mu);
  for (auto& [base, bytes] : st().allocs)
    kvscope::emu::free_guarded(reinterpret_cast<void*>(base), bytes);
  st().allocs.clear();
  st().allocated = 0;
  for (cudaStream_t s : st().streams) delete s;
  st().streams.clear();
  for (cudaEvent_t e : st().events) delete e;
  st().events.clear();
  st().func_smem.clear();
  kvscope::emu::g_direct_launches = 0;
  kvscope::emu::g_graph_launches = 0;
  kvscope::emu::g_graphs_instantiated = 0;
  kvscope::emu::g_kernels_run = 0;
  kvscope::emu::g_bytes_to_device = 0;
  kvscope::emu::g_bytes_to_host = 0;
  kvscope::emu::g_host_copies_to_device = 0;
  kvscope::emu::g_allocations = 0;
  kvscope::emu::g_programmatic_run = 0;
  kvscope::emu::g_all_waited = 0;
  kvscope::emu::g_cooperative_run = 0;
  st().last = st().sticky = cudaSuccess;
  st().detail.clear();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lk(st().mu);
  cudaError_t e = st().last;
  if (st().sticky == cudaSuccess) st().last = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().last;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    default: return cudaGetErrorName(e);
  }
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  KVSCOPE_EMU_STICKY();
  if (!s) return record(cudaErrorInvalidValue, "cudaStreamCreate: null");
  *s = new CUstream_st;
  std::lock_guard<std::mutex> lk(st().mu);
  st().streams.insert(*s);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> lk(st().mu);
  if (!st().streams.erase(s)) {
    st().last = cudaErrorInvalidResourceHandle;
    return cudaErrorInvalidResourceHandle;
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  KVSCOPE_EMU_STICKY();
  return kvscope::emu::stream_valid(s)
             ? cudaSuccess
             : record(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: unknown stream");
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (!e) return record(cudaErrorInvalidValue, "cudaEventCreate: null");
  *e = new CUevent_st;
  (*e)->flags = flags;
  std::lock_guard<std::mutex> lk(st().mu);
  st().events.insert(*e);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
static bool event_valid(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(st().mu);
  return st().events.count(e) != 0;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(st().mu);
  if (!st().events.erase(e)) return cudaErrorInvalidResourceHandle;
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  KVSCOPE_EMU_STICKY();
  if (!event_valid(e) || !kvscope::emu::stream_valid(s))
    return record(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown event or stream");
  auto op = [e] {
    e->recorded = true;
    e->t = std::chrono::steady_clock::now();
    return cudaSuccess;
  };
  if (kvscope::emu::capture_if_capturing(s, op)) return cudaSuccess;
  return op();
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  KVSCOPE_EMU_STICKY();
  return event_valid(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  return event_valid(e) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  KVSCOPE_EMU_STICKY();
  if (!ms) return record(cudaErrorInvalidValue, "cudaEventElapsedTime: null");
  if (!event_valid(a) || !event_valid(b) || (a->flags & cudaEventDisableTiming) ||
      (b->flags & cudaEventDisableTiming))
    return record(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: bad event");
  if (!a->recorded || !b->recorded)
    return record(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: event not recorded");
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}

// The emulated device: one SM of 2048 resident threads (emu.h cooperative_max_blocks).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func,
                                                          int block_size, size_t smem) {
  if (!num_blocks || !func || block_size <= 0 || block_size > 1024)
    return record(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: arguments");
  *num_blocks = smem > kvscope::emu::max_dynamic_smem(func)
                    ? 0
                    : kvscope::emu::cooperative_max_blocks(block_size);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || size_t(value) > kvscope::emu::kOptinSmem)
    return record(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                             " B is outside 0.." +
                                             std::to_string(kvscope::emu::kOptinSmem));
  std::lock_guard<std::mutex> lk(st().mu);
  st().func_smem[func] = size_t(value);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
  KVSCOPE_EMU_STICKY();
  if (!s || s == cudaStreamLegacy || !kvscope::emu::stream_valid(s))
    return record(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: needs a created stream");
  if (s->capturing) return record(cudaErrorIllegalState, "cudaStreamBeginCapture: already capturing");
  s->capturing = true;
  s->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
  if (!s || !kvscope::emu::stream_valid(s) || !s->capturing || !g)
    return record(cudaErrorIllegalState, "cudaStreamEndCapture: stream is not capturing");
  s->capturing = false;
  *g = new CUgraph_st{std::move(s->captured)};
  s->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!exec || !g) return record(cudaErrorInvalidValue, "cudaGraphInstantiate: null");
  *exec = new CUgraphExec_st{g->ops};
  ++kvscope::emu::g_graphs_instantiated;
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  KVSCOPE_EMU_STICKY();
  if (!exec) return record(cudaErrorInvalidValue, "cudaGraphLaunch: null graph");
  if (!kvscope::emu::stream_valid(s))
    return record(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: unknown stream");
  ++kvscope::emu::g_graph_launches;
  for (auto& op : exec->ops)
    if (cudaError_t e = op()) return e;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
