// emulation_runtime.h: what portable.cuh's emulation branch needs to compile the
// kernel source with a host C++ compiler (tests/emulation).
//
// Every GPU thread of a block runs as a fiber; a warp shuffle or a block barrier
// suspends the fiber until all its partners arrive (emulation_runtime.cpp). The
// warp size is a property of the launch, not of this header: the scheduler forms
// warps of the size the host passes to emu_launch.
#pragma once

#include <math.h>  // expf, logf, exp, log for the kernels' unqualified calls

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// ---- types ------------------------------------------------------------------
struct alignas(16) float4 {
  float x, y, z, w;
};

// Storage-only 16-bit floats: kernels only convert them to and from float.
struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

namespace ps_emu {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace ps_emu

inline float __bfloat162float(bfloat16_t h) { return ps_emu::bits_float(static_cast<uint32_t>(h.bits) << 16); }

inline bfloat16_t __float2bfloat16_rn(float f) {
  const uint32_t u = ps_emu::float_bits(f);
  bfloat16_t h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN stays NaN (quieted), sign kept
  } else {
    // Round to nearest even on the 16 dropped bits; a carry into the exponent
    // is the correct rounding, up to infinity included.
    h.bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return h;
}

inline float __half2float(half_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1fu;
  const uint32_t mantissa = h.bits & 0x3ffu;
  if (exponent == 0x1fu) return ps_emu::bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    // zero or subnormal: mantissa * 2^-24 is exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return ps_emu::bits_float(sign | ps_emu::float_bits(magnitude));
  }
  return ps_emu::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline half_t __float2half_rn(float f) {
  const uint32_t u = ps_emu::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7fffffffu;
  half_t h;
  if (magnitude > 0x7f800000u) {  // NaN: keep the top payload bits, force quiet
    h.bits = static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    return h;
  }
  if (magnitude >= 0x477ff000u) {  // rounds to >= 65520: infinity (or it was one)
    h.bits = static_cast<uint16_t>(sign | 0x7c00u);
    return h;
  }
  if (magnitude < 0x38800000u) {  // below 2^-14: subnormal half, a multiple of 2^-24
    // Adding 0.5 lines the half's subnormal step up with the float's last
    // mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
    const float shifted = ps_emu::bits_float(magnitude) + 0.5f;
    h.bits = static_cast<uint16_t>(sign | (ps_emu::float_bits(shifted) - 0x3f000000u));
    return h;
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
  const uint32_t rebased = magnitude - (112u << 23);
  h.bits = static_cast<uint16_t>(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13));
  return h;
}

// ---- the SIMT runtime (emulation_runtime.cpp) ----------------------------------
extern "C" {
// The ids of the fiber now running; the scheduler repoints it at every switch.
struct ps_emu_thread_ids {
  unsigned thread_x, block_x, block_dim_x, grid_dim_x;
  float4* dynamic_shared;
};
extern __thread const ps_emu_thread_ids* ps_emu_current_ids;

// Suspend until every lane of the calling warp has made the same call, then
// return the value lane (lane ^ lane_mask) passed, or the caller's own value when
// that lane lies past the end of the caller's width-lane segment (CUDA and HIP).
void ps_emu_shuffle_xor(const void* value, void* result, unsigned size, int lane_mask, int width);
// Suspend until every thread of the block has reached its barrier.
void ps_emu_sync_threads(void);
// Let other threads and blocks run while this thread waits on them (a spin-wait's body).
void ps_emu_spin_pause(void);
// A copy of 4, 8 or 16 aligned bytes into the block's dynamic shared memory (or a static array the
// block declared with PS_SHARED_COPY_TARGET) that lands only at the
// thread's next ps_emu_async_wait_all; the destination reads as poison until then. A thread that
// returns with copies it never waited for fails the launch.
void ps_emu_async_copy(void* shared_at, const void* global_at, unsigned bytes);
// Declares [at, at + bytes), a static shared array, a destination of the running block's copies.
void ps_emu_copy_target(const void* at, unsigned long bytes);
void ps_emu_async_wait_all(void);
// Closes the thread's current commit group of copies (cp.async.commit_group); the copies issued
// after it join the next one.
void ps_emu_async_commit(void);
// Lands every copy of the thread's committed groups but the `pending` newest (cp.async.wait_group);
// copies of the newer groups, and copies not yet committed, still read as poison.
void ps_emu_async_wait_group(int pending);
}

template <typename V>
inline V warp_shfl_xor(V v, int lane_mask, int width) {
  static_assert(std::is_trivially_copyable<V>::value && sizeof(V) <= 16, "shuffles move small plain values");
  V out;
  ps_emu_shuffle_xor(&v, &out, sizeof(V), lane_mask, width);
  return out;
}

#define PS_GLOBAL extern "C"
// A host thread runs one block at a time and a block never changes thread, so
// function statics per host thread are block-shared storage.
#define PS_SHARED static thread_local
#define PS_SHARED_COPY_TARGET(T, name, n) \
  static thread_local T name[n];        \
  ps_emu_copy_target(name, sizeof(name))
#define PS_SYNC() ps_emu_sync_threads()
#define PS_THREAD_X (ps_emu_current_ids->thread_x)
#define PS_BLOCK_X (ps_emu_current_ids->block_x)
#define PS_BLOCK_DIM_X (ps_emu_current_ids->block_dim_x)
#define PS_GRID_DIM_X (ps_emu_current_ids->grid_dim_x)
#define PS_LAUNCH_BOUNDS(threads)
#define PS_LAUNCH_BOUNDS_MIN(threads, blocks)
#define PS_MAX_REGISTERS(threads, blocks, registers)
#define PS_DYNAMIC_SHARED_BYTES(name) float4* const name = ps_emu_current_ids->dynamic_shared

// ---- communication between blocks ----------------------------------------------------
// Blocks of a launch run on several host threads, so these are real host atomics.
template <typename V, typename A>
inline V ps_emu_atomic_add(V* address, A increment) {
  const V value = static_cast<V>(increment);
  if constexpr (std::is_integral<V>::value) {
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
  } else {  // floating point: compare-and-swap, like atomicAdd on types without a native add
    V old;
    __atomic_load(address, &old, __ATOMIC_SEQ_CST);
    V sum;
    do {
      sum = old + value;
    } while (!__atomic_compare_exchange(address, &old, &sum, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
  }
}
#define PS_ATOMIC_ADD(address, value) ps_emu_atomic_add((address), (value))
#define PS_THREAD_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
// Relaxed, like the GPUs' plain 64-bit accesses: only the word itself is communicated.
#define PS_PUBLISH_WORD(address, value) __atomic_store_n((unsigned long long*)(address), (value), __ATOMIC_RELAXED)
#define PS_READ_WORD(address) __atomic_load_n((const unsigned long long*)(address), __ATOMIC_RELAXED)
#define PS_SPIN_PAUSE() ps_emu_spin_pause()

// ---- kernel registry: PS_EXPORT_KERNEL(name) makes `name` launchable by string ----
namespace ps_emu {

// Every kernel of the registry is called as thunk(args), args packed like
// cuLaunchKernel's kernelParams: args[i] points at the i-th parameter's value.
typedef void (*KernelThunk)(void** args);

// One letter per parameter, matching the planner's argument kinds: p = pointer
// ("ptr"), q = 64-bit integer ("i64"), i = 32-bit integer ("i32").
template <typename A>
constexpr char kind_letter() {
  return std::is_pointer<A>::value                                       ? 'p'
         : (std::is_integral<A>::value && sizeof(A) == 8)                ? 'q'
         : (std::is_integral<A>::value && sizeof(A) == 4)                ? 'i'
                                                                         : '?';
}

template <typename Sig, Sig F>
struct KernelAdapter;

template <typename... A, void (*F)(A...)>
struct KernelAdapter<void (*)(A...), F> {
  template <std::size_t... I>
  static void call(void** args, std::index_sequence<I...>) {
    F(*static_cast<typename std::remove_cv<A>::type*>(args[I])...);
  }
  static void thunk(void** args) { call(args, std::index_sequence_for<A...>{}); }
  static const char* kinds() {
    static const char letters[] = {kind_letter<A>()..., '\0'};
    return letters;
  }
};

void register_kernel(const char* name, KernelThunk thunk, const char* kinds);

struct KernelRegistrar {
  KernelRegistrar(const char* name, KernelThunk thunk, const char* kinds) { register_kernel(name, thunk, kinds); }
};

}  // namespace ps_emu

#define PS_EXPORT_KERNEL(name)                                                        \
  static const ps_emu::KernelRegistrar ps_emu_registrar_##name(                        \
      #name, &ps_emu::KernelAdapter<decltype(&name), &name>::thunk,                     \
      ps_emu::KernelAdapter<decltype(&name), &name>::kinds());
