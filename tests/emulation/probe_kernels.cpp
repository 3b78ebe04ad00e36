// probe_kernels.cpp: small kernels that exercise the emulated primitives one at a
// time (tests/test_emulation.py), written with the same PS_* vocabulary as the
// real kernels. Several break the SIMT rules on purpose, to show the emulator
// reports them instead of hanging.
#include "emulation_runtime.h"

namespace {

// out[mask * threads + t] = the value thread t receives from a shuffle with xor
// `mask`, for every mask in [0, masks): the whole butterfly table of one width.
template <typename V>
void shuffle_table(const V* in, V* out, int masks, int width) {
  const unsigned t = PS_THREAD_X, n = PS_BLOCK_DIM_X;
  for (int mask = 0; mask < masks; ++mask) out[mask * n + t] = warp_shfl_xor(in[t], mask, width);
}

}  // namespace

#define PROBE_SHUFFLE(NAME, V)                                              \
  PS_GLOBAL void NAME(const V* in, V* out, int masks, int width) {          \
    shuffle_table<V>(in, out, masks, width);                                \
  }                                                                         \
  PS_EXPORT_KERNEL(NAME)

PROBE_SHUFFLE(emu_probe_shuffle_f32, float)
PROBE_SHUFFLE(emu_probe_shuffle_f64, double)
PROBE_SHUFFLE(emu_probe_shuffle_i32, int)

// out[4 * global + k] = thread, block, block size, grid size of thread `global`.
PS_GLOBAL void emu_probe_ids(int* out) {
  const long long global = (long long)PS_BLOCK_X * PS_BLOCK_DIM_X + PS_THREAD_X;
  out[4 * global + 0] = (int)PS_THREAD_X;
  out[4 * global + 1] = (int)PS_BLOCK_X;
  out[4 * global + 2] = (int)PS_BLOCK_DIM_X;
  out[4 * global + 3] = (int)PS_GRID_DIM_X;
}
PS_EXPORT_KERNEL(emu_probe_ids)

// Each round every thread publishes its value and takes its right neighbour's:
// after `rounds` rounds thread t holds the start value of thread t + rounds (mod
// block), plus the round numbers; any missing barrier mixes up the rounds.
PS_GLOBAL void emu_probe_barrier_rotate(const int* in, int* out, int rounds) {
  PS_SHARED int ring[1024];
  const unsigned t = PS_THREAD_X, n = PS_BLOCK_DIM_X;
  int v = in[PS_BLOCK_X * n + t];
  for (int r = 0; r < rounds; ++r) {
    ring[t] = v;
    PS_SYNC();
    v = ring[(t + 1) % n] + r;
    PS_SYNC();
  }
  out[PS_BLOCK_X * n + t] = v;
}
PS_EXPORT_KERNEL(emu_probe_barrier_rotate)

// Dynamic shared memory: thread t writes slot t, reads slot n - 1 - t; `before`
// gets what slot t held at the start (the poison), in raw bits.
PS_GLOBAL void emu_probe_dynamic_shared(int* out, int* before) {
  PS_DYNAMIC_SHARED_BYTES(cache);
  int* slots = reinterpret_cast<int*>(cache);
  const unsigned t = PS_THREAD_X, n = PS_BLOCK_DIM_X;
  before[PS_BLOCK_X * n + t] = slots[t];
  PS_SYNC();
  slots[t] = (int)(PS_BLOCK_X * 1000 + t);
  PS_SYNC();
  out[PS_BLOCK_X * n + t] = slots[n - 1 - t];
}
PS_EXPORT_KERNEL(emu_probe_dynamic_shared)

// Reads a neighbour's slot (t + step, wrapping) with no barrier after the writes: a race
// that the emulator's alternating thread order exposes as the unwritten poison (-1).
PS_GLOBAL void emu_probe_missing_barrier(int* out, int step) {
  PS_DYNAMIC_SHARED_BYTES(cache);
  int* slots = reinterpret_cast<int*>(cache);
  const unsigned t = PS_THREAD_X, n = PS_BLOCK_DIM_X;
  slots[t] = (int)t;
  out[PS_BLOCK_X * n + t] = slots[(t + n + step) % n];
}
PS_EXPORT_KERNEL(emu_probe_missing_barrier)

// Thread t copies in[t] into slot t of dynamic shared memory asynchronously, from `shift` bytes
// past it; `before` gets the slot before the wait (poison), `after` after it. With wait == 0 the
// thread returns without waiting (a launch error).
PS_GLOBAL void emu_probe_async_copy(const int* in, int* before, int* after, int shift, int wait) {
  PS_DYNAMIC_SHARED_BYTES(cache);
  int* slots = reinterpret_cast<int*>(cache);
  const unsigned t = PS_THREAD_X;
  ps_emu_async_copy(&slots[t], reinterpret_cast<const char*>(&in[t]) + shift, 4);
  before[t] = slots[t];
  if (!wait) return;
  ps_emu_async_wait_all();
  after[t] = slots[t];
}
PS_EXPORT_KERNEL(emu_probe_async_copy)

// Thread t copies in[t], in[t + n] and in[t + 2n] to three slots, committing the first two copies
// as one group each and leaving the third uncommitted; `seen` gets the three slots after
// wait_group(1) (the first group landed), after wait_group(0) (both groups) and after wait_all.
PS_GLOBAL void emu_probe_async_groups(const int* in, int* seen) {
  PS_DYNAMIC_SHARED_BYTES(cache);
  int* slots = reinterpret_cast<int*>(cache);
  const unsigned t = PS_THREAD_X, n = PS_BLOCK_DIM_X;
  for (unsigned k = 0; k < 3; ++k) {
    ps_emu_async_copy(&slots[t + k * n], &in[t + k * n], 4);
    if (k < 2) ps_emu_async_commit();
  }
  const int pending[3] = {1, 0, -1};  // -1: wait_all
  for (unsigned w = 0; w < 3; ++w) {
    if (pending[w] < 0) {
      ps_emu_async_wait_all();
    } else {
      ps_emu_async_wait_group(pending[w]);
    }
    for (unsigned k = 0; k < 3; ++k) seen[(w * 3 + k) * n + t] = slots[t + k * n];
  }
}
PS_EXPORT_KERNEL(emu_probe_async_groups)

// Writes `bytes` bytes of dynamic shared memory (more than launched: an overflow).
PS_GLOBAL void emu_probe_shared_write(long long bytes) {
  PS_DYNAMIC_SHARED_BYTES(cache);
  if (PS_THREAD_X == 0) {
    for (long long i = 0; i < bytes; ++i) reinterpret_cast<char*>(cache)[i] = 0;
  }
}
PS_EXPORT_KERNEL(emu_probe_shared_write)

// Every block counts itself in, then thread 0 waits until `expected` blocks have: a
// grid-wide barrier, which ends only if all blocks of the grid are resident at once.
PS_GLOBAL void emu_probe_grid_barrier(unsigned* arrivals, int* out, int expected) {
  if (PS_THREAD_X == 0) {
    PS_ATOMIC_ADD(arrivals, 1u);
    while (PS_ATOMIC_ADD(arrivals, 0u) < (unsigned)expected) PS_SPIN_PAUSE();
  }
  PS_SYNC();
  out[PS_BLOCK_X * PS_BLOCK_DIM_X + PS_THREAD_X] = (int)PS_ATOMIC_ADD(arrivals, 0u);
}
PS_EXPORT_KERNEL(emu_probe_grid_barrier)

// ---- broken on purpose --------------------------------------------------------------
// Odd lanes make one more shuffle than even lanes (a lane-dependent loop count).
PS_GLOBAL void emu_probe_uneven_shuffles(float* out) {
  const unsigned t = PS_THREAD_X;
  float v = (float)t;
  for (unsigned i = 0; i < 1 + (t & 1); ++i) v = warp_shfl_xor(v, 1, 2);
  out[t] = v;
}
PS_EXPORT_KERNEL(emu_probe_uneven_shuffles)

// The upper half of each warp returns before the shuffle the lower half makes.
PS_GLOBAL void emu_probe_shuffle_after_exit(float* out, int warp) {
  const unsigned t = PS_THREAD_X;
  if (t % (unsigned)warp >= (unsigned)warp / 2) return;
  out[t] = warp_shfl_xor((float)t, 1, 2);
}
PS_EXPORT_KERNEL(emu_probe_shuffle_after_exit)

// Thread 0 leaves before a barrier every other thread waits at.
PS_GLOBAL void emu_probe_exit_before_barrier(int* out) {
  if (PS_THREAD_X == 0) return;
  PS_SYNC();
  out[PS_THREAD_X] = 1;
}
PS_EXPORT_KERNEL(emu_probe_exit_before_barrier)

// A shuffle wider than the launch's warp.
PS_GLOBAL void emu_probe_wide_shuffle(float* out, int width) { out[PS_THREAD_X] = warp_shfl_xor(1.0f, 1, width); }
PS_EXPORT_KERNEL(emu_probe_wide_shuffle)
