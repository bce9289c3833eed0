// emu_fiber.cpp — fibers, the per-block scheduler, barriers, warp exchange, worker pool.
//
// Each CUDA thread is a fiber with its own stack, switched by a hand-written x86-64
// context switch (the callee-saved registers; no syscalls). The floating-point control
// state (MXCSR, x87 control word) is not switched: device code cannot change it (CUDA
// has no call for it, and nothing in the kernels or the emulator sets it), so every fiber
// runs with its OS thread's, and a switch (a few per lane for every warp shuffle) does
// without ldmxcsr and fldcw, two slow instructions.
// A block runs on one OS worker thread: the scheduler sweeps its fibers round-robin;
// a fiber runs until it waits (barrier, warp exchange) or exits. A sweep in which no
// fiber changed any shared state is a deadlock: the launch fails with a report of
// what every thread waits on. Fibers never migrate between OS threads.
//
// A cooperative launch runs every block at once, each on its own OS thread (a pool kept
// for them), so that grid_sync() can hold them all: the block's threads meet at a
// block-level barrier, the last to arrive waits at an OS-level barrier (mutex + condition
// variable: what was written before is visible after) for every other block. A block that
// fails or finishes while others wait there aborts the barrier, and the launch fails.
//
// Under AddressSanitizer every switch is announced (__sanitizer_start_switch_fiber before,
// __sanitizer_finish_switch_fiber after), so ASan knows which stack is live: without it an
// exception thrown on a fiber stack is reported as stack-use-after-scope. A fiber left
// behind by a failed block has its stack unpoisoned before the stack is used again.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "kernels/emu/emu_internal.h"
#include "kernels/emu/emu_sanitizer.h"

#if !defined(__x86_64__)
#error "the CUDA emulator's context switch is written for x86-64"
#endif

extern "C" void kvscope_emu_switch(void** save_sp, void* new_sp);
extern "C" void kvscope_emu_fiber_trampoline();
extern "C" void kvscope_emu_fiber_main();

// switch: push the callee-saved registers, save rsp into *save_sp, load new_sp, pop the
// other context's registers, return into it. The 8 bytes below the registers keep the
// frame's size a multiple of 16 (see the initial frame in run_block).
asm(R"(
  .text
  .globl kvscope_emu_switch
  .type kvscope_emu_switch, @function
kvscope_emu_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size kvscope_emu_switch, .-kvscope_emu_switch

  .globl kvscope_emu_fiber_trampoline
  .type kvscope_emu_fiber_trampoline, @function
kvscope_emu_fiber_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  xorl %ebp, %ebp
  call kvscope_emu_fiber_main
  ud2
  .cfi_endproc
  .size kvscope_emu_fiber_trampoline, .-kvscope_emu_fiber_trampoline
)");

namespace kvscope::emu {
namespace {

constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kStackGuardBytes = 4096;
constexpr int kStackColours = 256;  // distinct cache-line offsets of the stacks' tops (16 KiB)

enum class FiberState { kReady, kBarrier, kWarp, kGridBarrier, kDone };

struct LaneSlot {
  enum { kEmpty, kDeposited, kReady } state = kEmpty;
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  uint64_t value = 0;
  int b = 0, c = 0;
  uint64_t result = 0;
};

struct Warp {
  LaneSlot lane[32];
  unsigned present = 0;  // lanes that exist in this (possibly partial) warp
  unsigned exited = 0;
  unsigned deposited = 0;  // lanes waiting in an exchange (state kDeposited)
};

struct Fiber {
  void* sp = nullptr;
  uint3 tid{};
  int linear = 0;
  FiberState state = FiberState::kReady;
  bool grid_waited = false;         // called grid_dependency_wait()
  bool started = false;             // has run (its first entry is from the scheduler)
  void* asan_fake_stack = nullptr;  // ASan's fake stack of this fiber while switched out
};

struct Block {
  int n = 0;
  int exited = 0;
  int grid_waited = 0;  // threads that called grid_dependency_wait()
  uint64_t bar_gen = 0;
  int bar_arrived = 0;
  int bar_acc[3] = {0, 1, 0};  // count, and, or of the generation being collected
  int bar_result[3] = {0, 0, 0};
  uint64_t progress = 0;
  uint64_t grid_gen = 0;  // grid barriers the block has passed
  int grid_arrived = 0;   // threads waiting at the current grid barrier
  std::vector<Warp> warps;
  const std::function<void()>* body = nullptr;
  bool failed = false;
  std::string error;
};

// One per OS thread that runs blocks: stacks and fibers are reused across blocks.
struct Worker {
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  Block* blk = nullptr;
  std::vector<Fiber> fibers;
  std::vector<unsigned char*> stacks;
  std::vector<bool> stack_dirty;  // abandoned mid-frame by a failed block (ASan shadow stale)
  std::vector<unsigned char> dyn_smem;
  // The scheduler's own stack, as ASan reports it when a fiber first starts.
  void* asan_sched_fake_stack = nullptr;
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;

  ~Worker() {
    // ASan's shadow of a range outlives its munmap: the frames a fiber never returned
    // from (kvscope_emu_fiber_main's) would stay poisoned for whatever is mapped there
    // next, such as a later thread's stack.
    for (unsigned char* s : stacks) {
      emu_unpoison(s + kStackGuardBytes, kStackBytes);
      munmap(s, kStackBytes + kStackGuardBytes);
    }
  }
  unsigned char* stack_top(size_t i) {
    while (stacks.size() <= i) {
      void* m = mmap(nullptr, kStackBytes + kStackGuardBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) throw DeviceFault{"emulator: cannot allocate a fiber stack"};
      mprotect(m, kStackGuardBytes, PROT_NONE);  // overflow faults instead of corrupting
      stacks.push_back(static_cast<unsigned char*>(m));
      stack_dirty.push_back(false);
    }
    if (stack_dirty[i]) {
      emu_unpoison(stacks[i] + kStackGuardBytes, kStackBytes);
      stack_dirty[i] = false;
    }
    return stacks[i] + kStackBytes + kStackGuardBytes;
  }
  const void* stack_bottom(size_t i) const { return stacks[i] + kStackGuardBytes; }
};

thread_local Worker* tls_worker = nullptr;

// The OS-level barrier of one cooperative launch, shared by the threads running its blocks.
class GridSync {
 public:
  explicit GridSync(uint64_t blocks) : blocks_(blocks) {}
  // The block's last thread to arrive at the grid barrier; returns once every block has
  // arrived. Throws DeviceFault when the barrier can never complete.
  void arrive_and_wait(uint3 bid) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!aborted_ && finished_ > 0) {
      aborted_ = true;
      why_ = std::to_string(finished_);
      why_ += " block(s) of the grid exited without reaching it";
      cv_.notify_all();
    }
    if (aborted_) throw DeviceFault{fault(bid)};
    if (++arrived_ == blocks_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    const uint64_t gen = gen_;
    cv_.wait(lk, [&] { return gen_ != gen || aborted_; });
    if (gen_ == gen) throw DeviceFault{fault(bid)};
  }
  // A block is done: ok, or failed with `why`. Either way no barrier with blocks still
  // waiting at it can complete any more.
  void block_done(bool ok, uint3 bid) {
    std::lock_guard<std::mutex> lk(mu_);
    if (ok) ++finished_;
    if (aborted_) return;
    if (!ok || arrived_ > 0) {
      aborted_ = true;
      why_ = "block ";
      why_ += tid_text(bid);
      why_ += ok ? " exited without reaching it" : " failed";
    }
    if (aborted_) cv_.notify_all();
  }

 private:
  static std::string tid_text(uint3 t) {
    std::ostringstream o;
    o << "(" << t.x << "," << t.y << "," << t.z << ")";
    return o.str();
  }
  std::string fault(uint3 bid) const {  // with mu_ held
    std::string m = "grid barrier in block ";
    m += tid_text(bid);
    m += ": ";
    m += why_;
    return m;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const uint64_t blocks_;
  uint64_t arrived_ = 0, gen_ = 0, finished_ = 0;
  bool aborted_ = false;
  std::string why_;
};

// The cooperative launch the calling OS thread runs a block of (nullptr: not cooperative).
thread_local GridSync* tls_grid = nullptr;

Worker& worker() {
  if (!tls_worker) {
    static thread_local std::unique_ptr<Worker> owned(new Worker);
    tls_worker = owned.get();
  }
  return *tls_worker;
}

// Scheduler -> fiber i. Returns when a fiber (i or one after it in the sweep, see
// yield_fiber) hands back to the scheduler; w.cur is then that fiber.
void resume_fiber(Worker& w, int i) {
  Fiber& f = w.fibers[i];
  f.started = true;
  w.cur = &f;
  threadIdx = f.tid;
  emu_start_switch_fiber(&w.asan_sched_fake_stack, w.stack_bottom(i), kStackBytes);
  kvscope_emu_switch(&w.sched_sp, f.sp);
  emu_finish_switch_fiber(w.asan_sched_fake_stack, nullptr, nullptr);
}

// Lets the other fibers run; returns when this one is resumed. The sweep goes on from
// fiber to fiber directly, without the scheduler in between (half the switches): to the
// next fiber of the block that has started and not exited. The scheduler takes over at
// the end of the sweep (where it checks for progress) and before a fiber's first entry
// (kvscope_emu_fiber_main learns the scheduler's stack there).
void yield_fiber() {
  Worker& w = *tls_worker;
  Fiber& f = *w.cur;
  const Block& b = *w.blk;
  int j = f.linear + 1;
  while (j < b.n && w.fibers[j].state == FiberState::kDone) ++j;
  if (j < b.n && w.fibers[j].started && !b.failed) {
    Fiber& next = w.fibers[j];
    w.cur = &next;
    threadIdx = next.tid;
    emu_start_switch_fiber(&f.asan_fake_stack, w.stack_bottom(j), kStackBytes);
    kvscope_emu_switch(&f.sp, next.sp);
    emu_finish_switch_fiber(f.asan_fake_stack, nullptr, nullptr);
    return;
  }
  emu_start_switch_fiber(&f.asan_fake_stack, w.sched_stack_bottom, w.sched_stack_size);
  kvscope_emu_switch(&f.sp, w.sched_sp);
  emu_finish_switch_fiber(f.asan_fake_stack, nullptr, nullptr);
}

std::string fmt_tid(uint3 t) {
  std::ostringstream o;
  o << "(" << t.x << "," << t.y << "," << t.z << ")";
  return o.str();
}

std::string hex(unsigned v) {
  std::ostringstream o;
  o << "0x" << std::hex << v;
  return o.str();
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kShflIdx: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kBallot: return "__ballot_sync/__any_sync/__all_sync";
    case WarpOp::kSync: return "__syncwarp";
  }
  return "?";
}

// The faults of a warp exchange, out of line: built in place, their message strings gave
// warp_exchange a large stack frame, which AddressSanitizer poisoned and cleared at every
// call (a third of an emulated test's time there).
[[noreturn, gnu::noinline, gnu::cold]] void fault_source_outside_mask(WarpOp op, int thread,
                                                                      int src, unsigned mask) {
  device_fault(std::string(op_name(op)) + ": lane " + std::to_string(thread) + " reads lane " +
               std::to_string(src) + " of its warp, which is not in mask " + hex(mask) +
               " (the value would be undefined on a GPU)");
}

[[noreturn, gnu::noinline, gnu::cold]] void fault_not_in_own_mask(WarpOp op, uint3 tid, int lane,
                                                                  unsigned mask) {
  device_fault(std::string(op_name(op)) + ": thread " + fmt_tid(tid) + " (lane " +
               std::to_string(lane) + ") is not in its own mask " + hex(mask));
}

[[noreturn, gnu::noinline, gnu::cold]] void fault_absent_lanes(WarpOp op, unsigned mask,
                                                               int warp_index, unsigned present) {
  device_fault(std::string(op_name(op)) + ": mask " + hex(mask) + " names lanes that do not " +
               "exist in warp " + std::to_string(warp_index) + " (present " + hex(present) + ")");
}

[[noreturn, gnu::noinline, gnu::cold]] void fault_lane_exited(WarpOp op, unsigned gone,
                                                              int warp_index, unsigned mask) {
  device_fault(std::string(op_name(op)) + ": lane " + std::to_string(__builtin_ctz(gone)) +
               " of warp " + std::to_string(warp_index) + " is in mask " + hex(mask) +
               " but has already exited");
}

// Source lane of a shuffle per the PTX shfl definition (b = lane/delta/mask,
// c = clamp word: bits 8..12 segment mask, bits 0..4 clamp lane).
int shuffle_source(WarpOp op, int lane, int b, int c) {
  const int segmask = (c >> 8) & 0x1f;
  const int cval = c & 0x1f;
  const int max_lane = (lane & segmask) | (cval & ~segmask);
  const int min_lane = lane & segmask;
  int j = lane;
  bool ok = false;
  switch (op) {
    case WarpOp::kShflUp: j = lane - b; ok = j >= max_lane; break;
    case WarpOp::kShflDown: j = lane + b; ok = j <= max_lane; break;
    case WarpOp::kShflXor: j = lane ^ (b & 0x1f); ok = j <= max_lane; break;
    case WarpOp::kShflIdx: j = min_lane | (b & 0x1f & ~segmask); ok = j <= max_lane; break;
    default: break;
  }
  return ok ? j : lane;
}

// Computes the results of a complete exchange among `mask`.
void complete_exchange(Warp& w, int warp_index, unsigned mask) {
  const LaneSlot& first = w.lane[__builtin_ctz(mask)];
  unsigned ballot = 0;
  if (first.op == WarpOp::kBallot) {
    for (int l = 0; l < 32; ++l)
      if ((mask >> l & 1u) && w.lane[l].value) ballot |= 1u << l;
  }
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    LaneSlot& s = w.lane[l];
    if (s.op == WarpOp::kBallot) {
      s.result = ballot;
    } else if (s.op == WarpOp::kSync) {
      s.result = 0;
    } else {
      int j = shuffle_source(s.op, l, s.b, s.c);
      if (!(mask >> j & 1u)) fault_source_outside_mask(s.op, warp_index * 32 + l, j, mask);
      s.result = w.lane[j].value;
    }
  }
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) w.lane[l].state = LaneSlot::kReady;
  w.deposited &= ~mask;
}

// Whether every lane of `mask` waits in the same exchange (same op, same mask) as the
// lane asking. Called only once every lane of the mask has deposited.
bool lanes_agree(const Warp& w, WarpOp op, unsigned mask) {
  for (unsigned m = mask; m != 0; m &= m - 1) {
    const LaneSlot& s = w.lane[__builtin_ctz(m)];
    if (s.mask != mask || s.op != op) return false;
  }
  return true;
}

void release_barrier_if_complete(Block& b) {
  if (b.bar_arrived > 0 && b.bar_arrived + b.exited == b.n) {
    for (int k = 0; k < 3; ++k) b.bar_result[k] = b.bar_acc[k];
    b.bar_acc[0] = 0;
    b.bar_acc[1] = 1;
    b.bar_acc[2] = 0;
    b.bar_arrived = 0;
    ++b.bar_gen;
    ++b.progress;
  }
}

std::string deadlock_report(const Worker& w, const Block& b) {
  std::ostringstream o;
  o << "deadlock in block " << fmt_tid(blockIdx) << ": no thread can make progress; "
    << b.exited << " of " << b.n << " threads exited";
  int shown = 0;
  for (const Fiber& f : w.fibers) {
    if (f.state == FiberState::kDone) continue;
    if (shown++ >= 8) {
      o << "; ...";
      break;
    }
    o << "; thread " << fmt_tid(f.tid);
    if (f.state == FiberState::kBarrier) {
      o << " waits at __syncthreads";
    } else if (f.state == FiberState::kGridBarrier) {
      o << " waits at the grid barrier";
    } else if (f.state == FiberState::kWarp) {
      const LaneSlot& s = b.warps[f.linear / 32].lane[f.linear % 32];
      o << " waits in " << op_name(s.op) << " with mask " << hex(s.mask);
    } else {
      o << " is runnable";
    }
  }
  return o.str();
}

// The first thread of b (in launch order) that did not call grid_dependency_wait().
std::string unwaited_report(const Worker& w, const Block& b) {
  for (int i = 0; i < b.n; ++i)
    if (!w.fibers[i].grid_waited)
      return "block " + fmt_tid(blockIdx) + " thread " + fmt_tid(w.fibers[i].tid) +
             " exited without grid_dependency_wait() in a programmatic dependent launch (" +
             std::to_string(b.n - b.grid_waited) + " of " + std::to_string(b.n) +
             " threads of the block did not wait): on a GPU it could read the previous "
             "kernel's results before they are written";
  return {};
}

// Runs one block to completion on this OS thread. Returns false on failure.
// *all_waited: every thread of the block called grid_dependency_wait().
bool run_block(const LaunchSpec& spec, uint3 bid, const std::function<void()>& body,
               std::string* detail, bool* all_waited) {
  Worker& w = worker();
  Block b;
  b.n = static_cast<int>(spec.block.x * spec.block.y * spec.block.z);
  b.body = &body;
  b.warps.assign((b.n + 31) / 32, Warp{});
  for (int i = 0; i < b.n; ++i) b.warps[i / 32].present |= 1u << (i % 32);
  w.blk = &b;
  if (w.dyn_smem.size() < spec.smem) w.dyn_smem.resize(spec.smem);
  std::fill(w.dyn_smem.begin(), w.dyn_smem.begin() + spec.smem, 0xFF);

  blockIdx = bid;
  blockDim = spec.block;
  gridDim = spec.grid;
  w.fibers.resize(b.n);
  for (int i = 0; i < b.n; ++i) {
    Fiber& f = w.fibers[i];
    f.linear = i;
    f.tid = uint3{static_cast<unsigned>(i % spec.block.x),
                  static_cast<unsigned>(i / spec.block.x % spec.block.y),
                  static_cast<unsigned>(i / (spec.block.x * spec.block.y))};
    f.state = FiberState::kReady;
    f.grid_waited = false;
    f.started = false;
    f.asan_fake_stack = nullptr;
    // Initial frame popped by kvscope_emu_switch: 8 bytes of padding, six registers,
    // return address = trampoline. After the `ret`, rsp is 16-byte aligned.
    // Each fiber's stack starts a different number of cache lines below its top: the
    // stacks are 132 KiB apart, a multiple of 4 KiB, so without the offset every fiber's
    // first frames would fall in the same L1 set and a few L2 sets, and a switch would
    // miss the cache on the new stack (most of its time, at 256 threads per block).
    unsigned char* top = w.stack_top(i) - size_t(i % kStackColours) * 64;
    auto* frame = reinterpret_cast<uint64_t*>(top - 64);
    std::memset(frame, 0, 64);
    frame[7] = reinterpret_cast<uint64_t>(&kvscope_emu_fiber_trampoline);
    f.sp = frame;
  }

  while (b.exited < b.n && !b.failed) {
    const uint64_t before = b.progress;
    for (int i = 0; i < b.n && !b.failed; ++i) {
      if (w.fibers[i].state == FiberState::kDone) continue;
      resume_fiber(w, i);
      i = w.cur->linear;  // the sweep has reached the fiber that handed back
    }
    if (!b.failed && b.exited < b.n && b.progress == before) {
      b.failed = true;
      b.error = deadlock_report(w, b);
    }
  }
  // Fibers of a failed block never return from their frames: their stacks still carry
  // ASan's redzones for frames that no longer exist.
  for (int i = 0; i < b.n; ++i)
    if (w.fibers[i].state != FiberState::kDone) w.stack_dirty[i] = true;
  *all_waited = b.grid_waited == b.n;
  if (!b.failed && spec.programmatic && !*all_waited) {
    b.failed = true;
    b.error = unwaited_report(w, b);
  }
  w.cur = nullptr;
  w.blk = nullptr;
  if (b.failed) *detail = b.error;
  return !b.failed;
}

// ---- worker pool ------------------------------------------------------------------

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  // Runs job on every pool thread and on the caller; returns when all are done.
  void run(const std::function<void()>& job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      job_ = &job;
      pending_ = static_cast<int>(threads_.size());
      ++epoch_;
    }
    cv_.notify_all();
    job();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || epoch_ != seen; });
        if (stop_) return;
        seen = epoch_;
        job = job_;
      }
      (*job)();
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void()>* job_ = nullptr;
  int pending_ = 0;
  uint64_t epoch_ = 0;
  bool stop_ = false;
};

std::mutex g_pool_mu;
int g_workers = [] {
  const char* e = std::getenv("KVSCOPE_EMU_WORKERS");
  int n = e ? std::atoi(e) : 1;
  return std::clamp(n, 1, 64);
}();
std::unique_ptr<Pool> g_pool;
// The cooperative launches' threads: one per block but the caller's (grown as needed).
std::unique_ptr<Pool> g_coop_pool;
uint64_t g_coop_threads = 0;

}  // namespace

// ---- entry points used by kernels ----------------------------------------------------

[[noreturn]] void device_fault(const std::string& message) { throw DeviceFault{message}; }

void fault_shuffle_width(int width) {
  device_fault("warp shuffle: width " + std::to_string(width) +
               " is not a power of two in [1, 32]");
}

unsigned char* dynamic_smem() { return worker().dyn_smem.data(); }

void syncthreads() {
  Worker& w = *tls_worker;
  Block& b = *w.blk;
  const uint64_t gen = b.bar_gen;
  ++b.bar_arrived;
  ++b.progress;
  release_barrier_if_complete(b);
  w.cur->state = FiberState::kBarrier;
  while (b.bar_gen == gen) yield_fiber();
  w.cur->state = FiberState::kReady;
}

void grid_sync() {
  Worker& w = *tls_worker;
  Block& b = *w.blk;
  if (tls_grid == nullptr)
    device_fault(
        "grid barrier (grid_sync, cooperative_groups::this_grid().sync()) in a kernel "
        "that was not launched cooperatively: on a GPU it would hang or be undefined "
        "(launch it with launch_cooperative / cudaLaunchCooperativeKernel)");
  const uint64_t gen = b.grid_gen;
  ++b.grid_arrived;
  ++b.progress;
  w.cur->state = FiberState::kGridBarrier;
  if (b.grid_arrived == b.n) {  // the whole block is here: now every other block
    tls_grid->arrive_and_wait(blockIdx);
    b.grid_arrived = 0;
    ++b.grid_gen;
    ++b.progress;
  } else {
    while (b.grid_gen == gen) yield_fiber();
  }
  w.cur->state = FiberState::kReady;
}

void grid_dependency_wait() {
  Worker& w = *tls_worker;
  if (!w.cur->grid_waited) {
    w.cur->grid_waited = true;
    ++w.blk->grid_waited;
  }
}

int syncthreads_reduce(int predicate, int kind) {
  Block& b = *tls_worker->blk;
  b.bar_acc[0] += predicate != 0;
  b.bar_acc[1] &= predicate != 0;
  b.bar_acc[2] |= predicate != 0;
  syncthreads();
  return b.bar_result[kind];
}

uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int b_arg, int c_arg) {
  Worker& wk = *tls_worker;
  Block& b = *wk.blk;
  const int linear = wk.cur->linear;
  const int warp_index = linear / 32;
  const int lane = linear % 32;
  Warp& w = b.warps[warp_index];
  if (!(mask >> lane & 1u)) fault_not_in_own_mask(op, wk.cur->tid, lane, mask);
  if (mask & ~w.present) fault_absent_lanes(op, mask, warp_index, w.present);
  LaneSlot& me = w.lane[lane];
  me.state = LaneSlot::kDeposited;
  me.op = op;
  me.mask = mask;
  me.value = value;
  me.b = b_arg;
  me.c = c_arg;
  w.deposited |= 1u << lane;
  ++b.progress;
  wk.cur->state = FiberState::kWarp;
  // The exchange completes when the last lane of the mask deposits (the lanes that came
  // before it wait until then); lanes that disagree on the op or mask never complete it,
  // which the scheduler reports as a deadlock.
  for (;;) {
    if (me.state == LaneSlot::kReady) break;
    if (const unsigned gone = mask & w.exited; gone != 0)
      fault_lane_exited(op, gone, warp_index, mask);
    if ((w.deposited & mask) == mask && lanes_agree(w, op, mask)) {
      complete_exchange(w, warp_index, mask);
      ++b.progress;
      break;
    }
    yield_fiber();
  }
  me.state = LaneSlot::kEmpty;
  wk.cur->state = FiberState::kReady;
  return me.result;
}

unsigned active_mask() {
  const Worker& wk = *tls_worker;
  const Warp& w = wk.blk->warps[wk.cur->linear / 32];
  return w.present & ~w.exited;
}

int cooperative_max_blocks(int threads_per_block) {
  return threads_per_block <= 0 ? 0 : std::max(1, 2048 / threads_per_block);
}

cudaError_t run_grid(const LaunchSpec& spec, const std::function<void()>& body, std::string* detail,
                     bool* all_waited) {
  const uint64_t total = uint64_t(spec.grid.x) * spec.grid.y * spec.grid.z;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<bool> every_waited{true};
  std::mutex err_mu;
  std::string first_error;
  // Cooperative: each OS thread takes exactly one block (there is a thread for every
  // block), so all of them are resident while any waits at the grid barrier.
  GridSync grid_sync_state(total);
  std::function<void()> coop_job = [&] {
    const uint64_t i = next.fetch_add(1);
    if (i >= total) return;
    const uint3 bid{static_cast<unsigned>(i % spec.grid.x),
                    static_cast<unsigned>(i / spec.grid.x % spec.grid.y),
                    static_cast<unsigned>(i / (uint64_t(spec.grid.x) * spec.grid.y))};
    std::string d;
    bool ok, waited = false;
    tls_grid = &grid_sync_state;
    try {
      ok = run_block(spec, bid, body, &d, &waited);
    } catch (const DeviceFault& f) {
      ok = false;
      d = f.message;
    }
    tls_grid = nullptr;
    if (!waited) every_waited = false;
    if (!ok) {
      std::lock_guard<std::mutex> lk(err_mu);
      // The first failure is the cause; blocks released from the barrier by it come later.
      if (!failed.exchange(true)) first_error = d;
    }
    grid_sync_state.block_done(ok, bid);
  };
  std::function<void()> job = [&] {
    std::string d;
    for (;;) {
      if (failed.load()) return;
      const uint64_t i = next.fetch_add(1);
      if (i >= total) return;
      const uint3 bid{static_cast<unsigned>(i % spec.grid.x),
                      static_cast<unsigned>(i / spec.grid.x % spec.grid.y),
                      static_cast<unsigned>(i / (uint64_t(spec.grid.x) * spec.grid.y))};
      bool ok;
      bool waited = false;
      try {
        ok = run_block(spec, bid, body, &d, &waited);
        if (!waited) every_waited = false;
      } catch (const DeviceFault& f) {
        ok = false;
        d = f.message;
      }
      if (!ok) {
        std::lock_guard<std::mutex> lk(err_mu);
        if (!failed.exchange(true)) first_error = d;
        return;
      }
    }
  };
  if (spec.cooperative) {
    std::lock_guard<std::mutex> lk(g_pool_mu);
    if (total <= 1) {
      coop_job();
    } else {
      if (!g_coop_pool || g_coop_threads < total - 1) {
        g_coop_pool.reset();
        g_coop_pool = std::make_unique<Pool>(static_cast<int>(total - 1));
        g_coop_threads = total - 1;
      }
      g_coop_pool->run(coop_job);
    }
  } else {
    std::lock_guard<std::mutex> lk(g_pool_mu);
    if (g_workers <= 1 || total <= 1) {
      job();
    } else {
      if (!g_pool) g_pool = std::make_unique<Pool>(g_workers - 1);
      g_pool->run(job);
    }
  }
  *all_waited = every_waited.load();
  if (failed.load()) {
    *detail = first_error;
    return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

void set_workers(int n) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_workers = std::clamp(n, 1, 64);
  g_pool.reset();
}

int workers() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  return g_workers;
}

}  // namespace kvscope::emu

// Entry of every fiber: runs the kernel body for the current thread, records a fault,
// marks the thread exited and returns to the scheduler for good.
extern "C" void kvscope_emu_fiber_main() {
  using namespace kvscope::emu;
  Worker& w = *tls_worker;
  // First entry: learn the scheduler's stack (where every yield returns to).
  emu_finish_switch_fiber(nullptr, &w.sched_stack_bottom, &w.sched_stack_size);
  Block& b = *w.blk;
  try {
    (*b.body)();
  } catch (const DeviceFault& f) {
    if (!b.failed) {
      b.failed = true;
      b.error = "block " + fmt_tid(blockIdx) + " thread " + fmt_tid(w.cur->tid) + ": " + f.message;
    }
  } catch (const std::exception& e) {
    if (!b.failed) {
      b.failed = true;
      b.error = "block " + fmt_tid(blockIdx) + " thread " + fmt_tid(w.cur->tid) +
                ": exception: " + e.what();
    }
  }
  Fiber& f = *w.cur;
  f.state = FiberState::kDone;
  ++b.exited;
  b.warps[f.linear / 32].exited |= 1u << (f.linear % 32);
  ++b.progress;
  release_barrier_if_complete(b);
  void* dead_sp;
  // nullptr: this fiber never comes back, ASan may drop its fake stack.
  emu_start_switch_fiber(nullptr, w.sched_stack_bottom, w.sched_stack_size);
  kvscope_emu_switch(&dead_sp, w.sched_sp);
  __builtin_unreachable();
}
