// emulation_runtime.cpp: runs kernels of the registry on the CPU, one fiber per
// GPU thread, with warps of the size the host asks for.
//
// A block runs on one host thread. Its fibers run until they block at a warp
// shuffle, a block barrier, a spin-wait or the kernel's end; then every warp
// whose lanes all wait at the same shuffle exchanges values in lock step, or,
// when no warp can, the barrier opens if every thread waits at it. Any other
// state means the lanes diverged, and the launch fails with a description of
// who waits where instead of hanging.
//
// Blocks of one launch are spread over a few host threads. A block that
// spin-waits on other blocks (PS_SPIN_PAUSE) keeps its host thread; when every
// host thread holds such a block, another thread joins, so blocks not yet
// started become resident and the wait can end, as on a GPU that fits the grid.
#include "emulation_runtime.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

__thread const ps_emu_thread_ids* ps_emu_current_ids = nullptr;

namespace ps_emu {
namespace {

constexpr std::size_t kFiberStackBytes = 16 * 1024;  // the kernels use under 2 KiB at -O2
// The foot of each fiber's stack holds this pattern, checked after every block: a stack that
// overflowed into it fails the launch. (A no-access page below each stack took two memory
// mappings a fiber; blocks of 1024 threads on a few hundred host threads then exceeded the
// process's 65530 mappings.)
constexpr std::size_t kStackCanaryBytes = 512;
constexpr unsigned char kStackCanaryByte = 0xa5;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr std::size_t kSharedGuardBytes = 64;
constexpr unsigned char kPoisonByte = 0xff;  // all-ones is NaN in every float format the kernels use
constexpr unsigned kMaxHostThreads = 256;    // blocks that may wait on each other at once
constexpr auto kSpinBackoff = std::chrono::microseconds(50);
// A spin-wait this long, with every block of the launch started, is taken for a deadlock.
std::atomic<long> spin_timeout_ms{20000};

struct KernelEntry {
  KernelThunk thunk;
  std::string kinds;
};

std::unordered_map<std::string, KernelEntry>& registry() {
  static std::unordered_map<std::string, KernelEntry> kernels;
  return kernels;
}

std::vector<std::string>& registry_order() {
  static std::vector<std::string> names;
  return names;
}

struct LaunchSpec {
  std::string kernel;
  KernelThunk thunk;
  void** args;
  unsigned warp, grid, block;
  std::size_t shared_bytes;
};

enum class Wait { kRunnable, kShuffle, kBarrier, kSpinning, kDone, kFailed };

struct Fiber {
  jmp_buf context;
  unsigned char* stack = nullptr;  // kFiberStackBytes, its lowest kStackCanaryBytes the canary
  bool booted = false;
  ps_emu_thread_ids ids{};
  Wait wait = Wait::kRunnable;
  long shuffles = 0, barriers = 0;  // calls made in the current block
  // the pending shuffle
  unsigned char value[16];
  void* result = nullptr;
  unsigned size = 0;
  int lane_mask = 0, width = 0;
  // copies to shared memory issued and not yet waited for (ps_emu_async_copy), each with the
  // commit group it joins (the count of commits before it), and the commits made so far
  struct PendingCopy { void* to; const void* from; unsigned bytes; long group; };
  std::vector<PendingCopy> copies;
  long commits = 0;
};

std::string thread_range(unsigned first, unsigned last) {
  return first == last ? "thread " + std::to_string(first)
                       : "threads " + std::to_string(first) + "-" + std::to_string(last);
}

std::string describe_wait(const Fiber& f) {
  switch (f.wait) {
    case Wait::kShuffle:
      return "at shuffle #" + std::to_string(f.shuffles) + " (xor " + std::to_string(f.lane_mask) + ", width " +
             std::to_string(f.width) + ", " + std::to_string(f.size) + " bytes)";
    case Wait::kBarrier:
      return "at barrier #" + std::to_string(f.barriers);
    case Wait::kSpinning:
      return "spin-waiting";
    case Wait::kDone:
      return "finished after " + std::to_string(f.shuffles) + " shuffles, " + std::to_string(f.barriers) +
             " barriers";
    default:
      return "running";
  }
}

class BlockPool;
BlockPool& block_pool();

// Host-thread state: the fibers (kept across blocks and launches) and the block's shared memory.
class Worker {
 public:
  ~Worker() {
    if (stacks_ != nullptr) munmap(stacks_ - page_bytes(), stacks_mapping_bytes());
  }

  // Runs one block; returns false with error() set when the block failed.
  bool run_block(const LaunchSpec& spec, unsigned block);

  const std::string& error() const { return error_; }

  // Whether [at, at + bytes) lies in the block's dynamic shared memory, or in a static array it
  // declared a destination of copies (PS_SHARED_COPY_TARGET).
  bool in_copy_destination(const void* at, std::size_t bytes) const {
    const unsigned char* first = reinterpret_cast<const unsigned char*>(shared_.data());
    const unsigned char* p = static_cast<const unsigned char*>(at);
    if (p >= first && p + bytes <= first + spec_->shared_bytes) return true;
    return std::any_of(copy_targets_.begin(), copy_targets_.end(), [&](const auto& target) {
      return p >= target.first && p + bytes <= target.first + target.second;
    });
  }
  void add_copy_target(const void* at, std::size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(at);
    for (const auto& target : copy_targets_) {
      if (target.first == p && target.second == bytes) return;
    }
    copy_targets_.emplace_back(p, bytes);
  }

  // ---- called on fibers ----------------------------------------------------------
  Fiber& running() { return *running_; }
  const LaunchSpec& spec() const { return *spec_; }

  void suspend() {
    if (_setjmp(running_->context) == 0) _longjmp(scheduler_, 1);
  }

  [[noreturn]] void fail_fiber(const std::string& message) {
    error_ = message;
    running_->wait = Wait::kFailed;
    suspend();
    __builtin_unreachable();  // a failed fiber is never resumed
  }

  static void fiber_main() {
    Worker* w = current();
    if (_setjmp(w->running_->context) == 0) _longjmp(w->scheduler_, 1);  // booted: park until the first block
    for (;;) {
      w = current();  // locals do not survive the jumps; the thread's worker does
      w->spec_->thunk(w->spec_->args);
      if (!w->running_->copies.empty()) {
        w->fail_fiber("kernel " + w->spec_->kernel + ": thread " + std::to_string(w->running_->ids.thread_x) +
                      " returned with " + std::to_string(w->running_->copies.size()) +
                      " copies to shared memory it never waited for");
      }
      w->running_->wait = Wait::kDone;
      w->suspend();
    }
  }

  static Worker* current() {
    static thread_local Worker worker;
    return &worker;
  }

 private:
  static std::size_t page_bytes() { return static_cast<std::size_t>(sysconf(_SC_PAGESIZE)); }
  // The fibers' stacks (a block's largest number of them) and the no-access page below them.
  static std::size_t stacks_mapping_bytes() { return page_bytes() + kMaxBlockThreads * kFiberStackBytes; }

  bool fail(const std::string& message) {
    error_ = message;
    return false;
  }

  bool prepare(const LaunchSpec& spec) {
    if (stacks_ == nullptr) {
      // Every fiber's stack in one mapping (pages taken as they are touched), a no-access page
      // below the lowest: a stack overflows into the canary of its own foot, then into the stack
      // below it or that page.
      void* at = mmap(nullptr, stacks_mapping_bytes(), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (at == MAP_FAILED) return fail("emulation: cannot map the fibers' stacks");
      mprotect(at, page_bytes(), PROT_NONE);
      stacks_ = static_cast<unsigned char*>(at) + page_bytes();
    }
    while (fibers_.size() < spec.block) {
      auto f = std::make_unique<Fiber>();
      f->stack = stacks_ + fibers_.size() * kFiberStackBytes;
      std::memset(f->stack, kStackCanaryByte, kStackCanaryBytes);
      fibers_.push_back(std::move(f));
    }
    for (unsigned t = 0; t < spec.block; ++t) {
      if (!fibers_[t]->booted && !boot(*fibers_[t])) return false;
    }
    shared_.resize((spec.shared_bytes + kSharedGuardBytes + sizeof(float4) - 1) / sizeof(float4));
    return true;
  }

  // Starts a fiber on its own stack; it parks at once (fiber_main) and jumps back.
  bool boot(Fiber& f) {
    ucontext_t start;
    if (getcontext(&start) != 0) return fail("emulation: getcontext failed");
    start.uc_stack.ss_sp = f.stack;
    start.uc_stack.ss_size = kFiberStackBytes;
    start.uc_link = nullptr;
    makecontext(&start, &Worker::fiber_main, 0);
    running_ = &f;
    if (_setjmp(scheduler_) == 0) setcontext(&start);
    f.booted = true;
    return true;
  }

  void resume(Fiber& f) {
    running_ = &f;
    ps_emu_current_ids = &f.ids;
    if (_setjmp(scheduler_) == 0) _longjmp(f.context, 1);
  }

  bool schedule();
  int exchange(unsigned first, unsigned last);
  bool wait_on_other_blocks();
  void stop_waiting();
  bool all_same_barrier() const;
  std::string where() const;
  std::string stuck_report() const;

  std::vector<std::unique_ptr<Fiber>> fibers_;
  unsigned char* stacks_ = nullptr;  // the fibers' stacks, kFiberStackBytes each
  std::vector<float4> shared_;  // dynamic shared memory and a guard zone, 16-byte aligned
  // static shared arrays the running block declared destinations of copies
  std::vector<std::pair<const unsigned char*, std::size_t>> copy_targets_;
  jmp_buf scheduler_;
  Fiber* running_ = nullptr;
  const LaunchSpec* spec_ = nullptr;
  unsigned block_ = 0;
  bool waiting_ = false;  // the block spin-waits on other blocks
  std::chrono::steady_clock::time_point waiting_since_;
  std::string error_;
};

// Spreads the blocks of a launch over the calling thread and helper threads.
class BlockPool {
 public:
  ~BlockPool() { resize(0); }

  void resize(unsigned helpers) {
    forget_helpers_after_fork();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : helpers_) t.join();
    helpers_.clear();
    stop_ = false;
    for (unsigned i = 0; i < helpers; ++i) add_helper(generation_);
  }

  bool run(const LaunchSpec& spec, std::string* error) {
    forget_helpers_after_fork();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spec_ = &spec;
      next_block_ = 0;
      failed_ = false;
      error_.clear();
      busy_ = static_cast<unsigned>(helpers_.size());
      active_ = busy_ + 1;  // the helpers and this thread
      waiting_ = 0;
      ++generation_;
    }
    start_.notify_all();
    run_blocks();
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return busy_ == 0; });
    *error = error_;
    return !failed_;
  }

  bool failed() const { return failed_.load(); }

  // A worker's block spin-waits on other blocks (begin / end of the wait).
  void wait_begins() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++waiting_;
  }
  void wait_ends() {
    std::lock_guard<std::mutex> lock(mutex_);
    --waiting_;
  }

  // Called while a block spin-waits: when every working thread holds a waiting block
  // and blocks are still to start, one more thread joins to start them. Then backs off.
  void let_other_blocks_run() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (waiting_ == active_ && next_block_.load() < spec_->grid && helpers_.size() + 1 < kMaxHostThreads) {
        ++busy_;
        ++active_;
        add_helper(generation_ - 1);  // joins the current launch at once
      }
    }
    std::this_thread::sleep_for(kSpinBackoff);
  }

 private:
  void add_helper(unsigned long long seen) {
    helpers_.emplace_back([this, seen] { helper_loop(seen); });
  }

  void run_blocks() {
    Worker* worker = Worker::current();
    for (;;) {
      const unsigned block = next_block_.fetch_add(1);
      if (block >= spec_->grid || failed_.load()) break;
      if (!worker->run_block(*spec_, block)) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failed_.exchange(true)) error_ = worker->error();
        break;
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    --active_;
  }

  void helper_loop(unsigned long long seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      run_blocks();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) finished_.notify_all();
    }
  }

  // A forked child has none of the parent's helper threads: never wait for or join them.
  void forget_helpers_after_fork() {
    if (owner_ == getpid()) return;
    owner_ = getpid();
    new std::vector<std::thread>(std::move(helpers_));  // leaked: destroying joinable threads aborts
    helpers_.clear();
  }

  std::vector<std::thread> helpers_;
  pid_t owner_ = getpid();
  std::mutex mutex_;
  std::condition_variable start_, finished_;
  bool stop_ = false;
  unsigned long long generation_ = 0;
  unsigned busy_ = 0;     // helpers still working on the current launch
  unsigned active_ = 0;   // threads running or about to run blocks of the current launch
  unsigned waiting_ = 0;  // of those, threads whose block spin-waits on other blocks
  const LaunchSpec* spec_ = nullptr;
  std::atomic<unsigned> next_block_{0};
  std::atomic<bool> failed_{false};
  std::string error_;
};

BlockPool& block_pool() {
  static BlockPool pool;
  return pool;
}

bool Worker::run_block(const LaunchSpec& spec, unsigned block) {
  spec_ = &spec;
  if (!prepare(spec)) return false;
  unsigned char* const shared_bytes = reinterpret_cast<unsigned char*>(shared_.data());
  const std::size_t mapped_bytes = shared_.size() * sizeof(float4);
  std::fill(shared_bytes, shared_bytes + mapped_bytes, kPoisonByte);  // shared memory starts undefined
  float4* const shared = shared_.data();
  copy_targets_.clear();
  for (unsigned t = 0; t < spec.block; ++t) {
    Fiber& f = *fibers_[t];
    f.ids = {t, block, spec.block, spec.grid, shared};
    f.wait = Wait::kRunnable;
    f.shuffles = f.barriers = 0;
    f.copies.clear();
    f.commits = 0;
  }
  block_ = block;
  const bool ok = schedule();
  stop_waiting();
  ps_emu_current_ids = nullptr;
  if (!ok) {
    for (auto& f : fibers_) f->booted = false;  // abandoned mid-kernel: boot afresh next time
    return false;
  }
  for (unsigned t = 0; t < spec.block; ++t) {
    const unsigned char* foot = fibers_[t]->stack;
    if (std::any_of(foot, foot + kStackCanaryBytes, [](unsigned char b) { return b != kStackCanaryByte; })) {
      return fail("block " + std::to_string(block) + ": thread " + std::to_string(t) + " overflowed its " +
                  std::to_string(kFiberStackBytes) + "-byte stack");
    }
  }
  if (std::any_of(shared_bytes + spec.shared_bytes, shared_bytes + mapped_bytes,
                  [](unsigned char b) { return b != kPoisonByte; })) {
    return fail("block " + std::to_string(block) + " wrote past its " + std::to_string(spec.shared_bytes) +
                " bytes of dynamic shared memory");
  }
  return true;
}

bool Worker::schedule() {
  const unsigned n = spec_->block, warp = spec_->warp;
  for (;;) {
    bool spinning = false;
    for (unsigned i = 0; i < n; ++i) {
      // Even blocks run their threads first to last, odd blocks last to first, so a shared
      // read that lacks its barrier finds the slot unwritten (NaN) in one order or the other.
      Fiber& f = *fibers_[block_ % 2 ? n - 1 - i : i];
      if (f.wait != Wait::kRunnable && f.wait != Wait::kSpinning) continue;
      resume(f);
      if (f.wait == Wait::kFailed) return false;
      spinning |= f.wait == Wait::kSpinning;
    }
    bool exchanged = false;
    for (unsigned first = 0; first < n; first += warp) {
      const int result = exchange(first, std::min(n, first + warp) - 1);
      if (result < 0) return false;
      exchanged |= result > 0;
    }
    if (exchanged) continue;
    unsigned done = 0, at_barrier = 0;
    for (unsigned t = 0; t < n; ++t) {
      done += fibers_[t]->wait == Wait::kDone;
      at_barrier += fibers_[t]->wait == Wait::kBarrier;
    }
    if (done == n) return true;
    if (at_barrier == n && all_same_barrier()) {
      for (unsigned t = 0; t < n; ++t) fibers_[t]->wait = Wait::kRunnable;
      continue;
    }
    if (spinning) {  // nothing moves inside the block: it waits on another one
      if (!wait_on_other_blocks()) return false;
      continue;
    }
    stop_waiting();
    return fail(stuck_report());
  }
}

bool Worker::wait_on_other_blocks() {
  const auto now = std::chrono::steady_clock::now();
  if (!waiting_) {
    waiting_ = true;
    waiting_since_ = now;
    block_pool().wait_begins();
  }
  if (block_pool().failed()) return fail(where() + ": stopped while spin-waiting, another block failed");
  const long waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - waiting_since_).count();
  if (waited_ms > spin_timeout_ms.load()) {
    return fail(where() + ": spin-waited " + std::to_string(waited_ms) + " ms on other blocks, which wait on "
                "each other forever (or on a block that never runs):" + stuck_report());
  }
  block_pool().let_other_blocks_run();
  return true;
}

void Worker::stop_waiting() {
  if (!waiting_) return;
  waiting_ = false;
  block_pool().wait_ends();
}

// Exchanges the values of warp lanes [first, last] if all wait at one shuffle:
// 1 exchanged, 0 not all there yet, -1 failed (they disagree about the call).
int Worker::exchange(unsigned first, unsigned last) {
  for (unsigned t = first; t <= last; ++t) {
    if (fibers_[t]->wait != Wait::kShuffle) return 0;
  }
  const Fiber& lead = *fibers_[first];
  for (unsigned t = first + 1; t <= last; ++t) {
    const Fiber& f = *fibers_[t];
    if (f.shuffles != lead.shuffles || f.width != lead.width || f.lane_mask != lead.lane_mask || f.size != lead.size) {
      fail(where() + ": lanes of warp " + std::to_string(first / spec_->warp) + " diverge at a shuffle: lane " +
           std::to_string(first) + " " + describe_wait(lead) + ", lane " + std::to_string(t) + " " +
           describe_wait(f));
      return -1;
    }
  }
  const unsigned width = static_cast<unsigned>(lead.width);
  for (unsigned t = first; t <= last; ++t) {
    const unsigned lane = t - first;
    const unsigned segment_end = (lane & ~(width - 1)) + width;
    // CUDA's and HIP's rule: a source beyond the lane's own segment gives the lane's own value.
    unsigned source = lane ^ static_cast<unsigned>(lead.lane_mask);
    if (source >= segment_end) source = lane;
    if (first + source > last) {
      fail(where() + ": lane " + std::to_string(t) + " reads lane " + std::to_string(first + source) +
           ", beyond the block's last thread");
      return -1;
    }
    std::memcpy(fibers_[t]->result, fibers_[first + source]->value, lead.size);
  }
  for (unsigned t = first; t <= last; ++t) fibers_[t]->wait = Wait::kRunnable;
  return 1;
}

bool Worker::all_same_barrier() const {
  for (unsigned t = 1; t < spec_->block; ++t) {
    if (fibers_[t]->barriers != fibers_[0]->barriers) return false;
  }
  return true;
}

std::string Worker::where() const {
  return "kernel " + spec_->kernel + " (warp " + std::to_string(spec_->warp) + ", block " + std::to_string(block_) +
         " of " + std::to_string(spec_->grid) + ", " + std::to_string(spec_->block) + " threads)";
}

// Nothing can move: say who waits where, as runs of threads of one warp in the same
// state. A stuck shuffle names only the warps holding it; a barrier, the whole block.
std::string Worker::stuck_report() const {
  const unsigned n = spec_->block, warp = spec_->warp;
  std::vector<bool> shuffling((n + warp - 1) / warp, false);
  for (unsigned t = 0; t < n; ++t) shuffling[t / warp] = shuffling[t / warp] || fibers_[t]->wait == Wait::kShuffle;
  const bool any_shuffle = std::find(shuffling.begin(), shuffling.end(), true) != shuffling.end();
  std::string report = where() + (any_shuffle ? ": lanes of a warp diverge at a shuffle (every lane of the warp "
                                                "must make each shuffle call):"
                                              : ": a block barrier is not reached by every thread:");
  constexpr int kMaxRuns = 8;
  int runs = 0;
  unsigned first = 0;
  for (unsigned t = 1; t <= n; ++t) {
    const bool same_run =
        t < n && t / warp == first / warp && describe_wait(*fibers_[t]) == describe_wait(*fibers_[first]);
    if (same_run) continue;
    if ((!any_shuffle || shuffling[first / warp]) && runs++ < kMaxRuns) {
      report += " " + thread_range(first, t - 1) + " " + describe_wait(*fibers_[first]) + ";";
    }
    first = t;
  }
  if (runs > kMaxRuns) report += " ... " + std::to_string(runs - kMaxRuns) + " more runs";
  return report;
}

std::mutex launch_mutex;  // one launch at a time: static shared memory is per host thread, not per launch
std::string last_error;

bool is_power_of_two(long v) { return v > 0 && (v & (v - 1)) == 0; }

template <typename From, typename To, To (*Convert)(From)>
void convert_all(const From* in, To* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = Convert(in[i]);
}

}  // namespace

void register_kernel(const char* name, KernelThunk thunk, const char* kinds) {
  if (registry().emplace(name, KernelEntry{thunk, kinds}).second) registry_order().push_back(name);
}

}  // namespace ps_emu

using ps_emu::Worker;

extern "C" {

void ps_emu_shuffle_xor(const void* value, void* result, unsigned size, int lane_mask, int width) {
  Worker* w = Worker::current();
  ps_emu::Fiber& f = w->running();
  ++f.shuffles;
  f.lane_mask = lane_mask;
  f.width = width;
  f.size = size;
  f.result = result;
  std::memcpy(f.value, value, size);
  const unsigned warp = w->spec().warp;
  if (!ps_emu::is_power_of_two(width) || static_cast<unsigned>(width) > warp || lane_mask < 0) {
    w->fail_fiber("kernel " + w->spec().kernel + ": thread " + std::to_string(f.ids.thread_x) + " shuffles with xor " +
                  std::to_string(lane_mask) + " and width " + std::to_string(width) +
                  "; the width must be a power of two no larger than the warp (" + std::to_string(warp) + ")");
  }
  f.wait = ps_emu::Wait::kShuffle;
  w->suspend();
}

void ps_emu_sync_threads(void) {
  Worker* w = Worker::current();
  ++w->running().barriers;
  w->running().wait = ps_emu::Wait::kBarrier;
  w->suspend();
}

void ps_emu_async_copy(void* shared_at, const void* global_at, unsigned bytes) {
  Worker* w = Worker::current();
  ps_emu::Fiber& f = w->running();
  const std::string who = "kernel " + w->spec().kernel + ": thread " + std::to_string(f.ids.thread_x);
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    w->fail_fiber(who + " copies " + std::to_string(bytes) + " bytes to shared memory; 4, 8 or 16 can be copied");
  }
  if (reinterpret_cast<std::uintptr_t>(shared_at) % bytes != 0 || reinterpret_cast<std::uintptr_t>(global_at) % bytes != 0) {
    w->fail_fiber(who + " copies " + std::to_string(bytes) + " bytes between addresses not aligned to them");
  }
  if (!w->in_copy_destination(shared_at, bytes)) {
    w->fail_fiber(who + " copies to an address outside the block's dynamic shared memory and its declared arrays");
  }
  std::memset(shared_at, ps_emu::kPoisonByte, bytes);  // undefined until the wait
  f.copies.push_back({shared_at, global_at, bytes, f.commits});
}

void ps_emu_copy_target(const void* at, unsigned long bytes) { Worker::current()->add_copy_target(at, bytes); }

void ps_emu_async_commit(void) { ++Worker::current()->running().commits; }

void ps_emu_async_wait_group(int pending) {
  ps_emu::Fiber& f = Worker::current()->running();
  const long done_below = f.commits - pending;  // groups older than the `pending` newest land
  std::vector<ps_emu::Fiber::PendingCopy> left;
  for (const auto& c : f.copies) {
    if (c.group < done_below) {
      std::memcpy(c.to, c.from, c.bytes);
    } else {
      left.push_back(c);
    }
  }
  f.copies.swap(left);
}

void ps_emu_async_wait_all(void) {
  ps_emu::Fiber& f = Worker::current()->running();
  for (const auto& c : f.copies) std::memcpy(c.to, c.from, c.bytes);
  f.copies.clear();
}

void ps_emu_spin_pause(void) {
  Worker* w = Worker::current();
  w->running().wait = ps_emu::Wait::kSpinning;
  w->suspend();
}

// ---- the host interface (ctypes) ---------------------------------------------------
const char* emu_last_error(void) { return ps_emu::last_error.c_str(); }

int emu_kernel_count(void) { return static_cast<int>(ps_emu::registry_order().size()); }

const char* emu_kernel_name(int index) {
  const auto& names = ps_emu::registry_order();
  return index >= 0 && index < static_cast<int>(names.size()) ? names[static_cast<std::size_t>(index)].c_str()
                                                               : nullptr;
}

void emu_set_spin_timeout_ms(long milliseconds) { ps_emu::spin_timeout_ms = milliseconds; }

void emu_set_threads(int threads) {
  ps_emu::block_pool().resize(threads > 1 ? static_cast<unsigned>(threads - 1) : 0);
}

// Runs kernel `name` on grid x block threads in warps of `warp` lanes. `kinds` is one
// letter per argument (p pointer, q int64, i int32), checked against the kernel's
// signature; args[i] points at argument i. Returns 0, or 1 with emu_last_error() set.
int emu_launch(const char* name, const char* kinds, int warp, unsigned grid, unsigned block, size_t shared_bytes,
               void** args) {
  std::lock_guard<std::mutex> lock(ps_emu::launch_mutex);
  ps_emu::last_error.clear();
  const auto found = ps_emu::registry().find(name);
  std::string error;
  if (found == ps_emu::registry().end()) {
    error = std::string("no kernel named ") + name + " in the emulation library";
  } else if (found->second.kinds != kinds) {
    error = std::string("kernel ") + name + " takes arguments (" + found->second.kinds + "), the launch passes (" +
            kinds + ")";
  } else if (!ps_emu::is_power_of_two(warp) || warp > static_cast<int>(ps_emu::kMaxBlockThreads)) {
    error = "warp size " + std::to_string(warp) + " is not a power of two up to 1024";
  } else if (grid == 0 || block == 0 || block > ps_emu::kMaxBlockThreads) {
    error = std::string("kernel ") + name + ": launch shape grid " + std::to_string(grid) + " x block " +
            std::to_string(block) + " is empty or exceeds 1024 threads per block";
  } else {
    const ps_emu::LaunchSpec spec{name, found->second.thunk, args, static_cast<unsigned>(warp), grid, block,
                                  shared_bytes};
    if (ps_emu::block_pool().run(spec, &error)) return 0;
  }
  ps_emu::last_error = error;
  return 1;
}

void emu_half_to_float(const half_t* in, float* out, size_t n) {
  ps_emu::convert_all<half_t, float, __half2float>(in, out, n);
}
void emu_float_to_half(const float* in, half_t* out, size_t n) {
  ps_emu::convert_all<float, half_t, __float2half_rn>(in, out, n);
}
void emu_bfloat16_to_float(const bfloat16_t* in, float* out, size_t n) {
  ps_emu::convert_all<bfloat16_t, float, __bfloat162float>(in, out, n);
}
void emu_float_to_bfloat16(const float* in, bfloat16_t* out, size_t n) {
  ps_emu::convert_all<float, bfloat16_t, __float2bfloat16_rn>(in, out, n);
}

}  // extern "C"
