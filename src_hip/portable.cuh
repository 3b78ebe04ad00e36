// Generated from src_cuda/portable.cuh by tools/hipify_sources.py (torch.utils.hipify, torch 2.13.0). Do not edit.
// portable.cuh: the only file that knows which vendor compiles the kernels.
//
// Kernels see: half_t / bfloat16_t storage types, to_compute / from_compute
// conversions, warp_shfl_xor(v, lane_mask, width), math (ps_fma, ps_exp, ps_log),
// and the PS_* qualifiers. The warp size is never read here: kernels take it
// as a template parameter (WARP) chosen by the host from the device.
#pragma once

#if defined(PORTABLE_SOFTMAX_EMULATION)
// Host-compiled SIMT emulation (tests/emulation): supplies threads, shuffles,
// shared memory and the 16-bit float types.
#include "emulation_runtime.h"
#define PS_DEVICE inline
#define PS_WAVE64 1
#define PS_ASYNC_COPY_TIERS 1  // the emulation runs the tiers built on asynchronous copies too

#elif defined(__HIP__) || defined(__HIPCC__)
// AMD ROCm: hipcc / amdclang++ and hipRTC; clang defines __HIP__ for both.
// hipRTC (__HIPCC_RTC__) comes with the runtime and fp16 headers built in and
// serves no other header, so it includes nothing. Built with ROCm 5.2 (Debian
// 12's hipcc) and written for ROCm 6 / 7, whose bf16 header differs.
#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#if defined(__has_include)
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#define PS_HIP_VENDOR_BF16 1
#endif
#endif
#endif
#define PS_DEVICE __device__ __forceinline__
#define PS_WAVE64 1  // CDNA (gfx9) runs wave64, RDNA (gfx10+) wave32: both variants are built
#define PS_ASYNC_COPY_TIERS 0  // no cp.async: the tiers built on it are not built
typedef __half half_t;

#if defined(PS_HIP_VENDOR_BF16)
typedef __hip_bfloat16 bfloat16_t;
PS_DEVICE float ps_hip_bf16_to_float(bfloat16_t v) { return __bfloat162float(v); }
// HIP's __float2bfloat16 rounds to nearest even and keeps NaN (CUDA's _rn).
PS_DEVICE bfloat16_t ps_hip_float_to_bf16(float v) { return __float2bfloat16(v); }
#else
// hipRTC, and ROCm before hip_bf16.h (5.2 has only hip_bfloat16.h, whose class
// needs <ostream>): 2-byte storage converted by hand, rounding to nearest even
// and keeping NaN quiet like __float2bfloat16_rn. Same layout as __hip_bfloat16.
struct ps_hip_bfloat16 { unsigned short bits; };
typedef ps_hip_bfloat16 bfloat16_t;
PS_DEVICE float ps_hip_bf16_to_float(bfloat16_t v) { return __uint_as_float(static_cast<unsigned>(v.bits) << 16); }
PS_DEVICE bfloat16_t ps_hip_float_to_bf16(float v) {
  const unsigned u = __float_as_uint(v);
  bfloat16_t r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = static_cast<unsigned short>((u >> 16) | 0x40u);
  } else {
    r.bits = static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return r;
}
#endif
// The shared conversions below use CUDA's names; HIP spells them differently
// by release, so they are routed to the functions above (after every vendor
// header, so no vendor declaration is renamed).
#define __bfloat162float ps_hip_bf16_to_float
#define __float2bfloat16_rn ps_hip_float_to_bf16

// The mask-less shuffle exchanges among `width` lanes of the wavefront; it is
// correct for wave32 and wave64 alike and needs no 32- or 64-bit lane mask.
template <typename V>
PS_DEVICE V warp_shfl_xor(V v, int lane_mask, int width) {
  return __shfl_xor(v, lane_mask, width);
}
// Back off while waiting on another block (a few cycles of s_sleep).
#define PS_SPIN_PAUSE() __builtin_amdgcn_s_sleep(1)

#else  // NVIDIA CUDA (nvcc or NVRTC)
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>
#define PS_DEVICE __device__ __forceinline__
#define PS_WAVE64 0  // NVIDIA warps are 32 lanes: WARP=64 variants are not built
#define PS_ASYNC_COPY_TIERS 1  // the tiers built on cp.async (planned for sm_80 and newer)
typedef __half half_t;
typedef __hip_bfloat16 bfloat16_t;

// Every lane of a 32-lane NVIDIA warp takes part in each shuffle (kernels keep
// loops warp-uniform), so the mask names the whole warp.
constexpr unsigned kWholeWarpMask = ~0u;
template <typename V>
PS_DEVICE V warp_shfl_xor(V v, int lane_mask, int width) {
  return __shfl_xor_sync(kWholeWarpMask, v, lane_mask, width);
}
// Back off while waiting on another block (sm_70 and newer).
#define PS_SPIN_PAUSE() __nanosleep(64)
// NVRTC has no __builtin_huge_val / __builtin_nan: spell the bits.
#define PS_INF_F __int_as_float(0x7f800000)
#define PS_NAN_F __int_as_float(0x7fffffff)
#define PS_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define PS_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#endif

// The hardware's base-2 exponential (inputs below -126 give 0 on NVIDIA), reciprocal and base-2
// logarithm.
#if defined(PORTABLE_SOFTMAX_EMULATION)
#define PS_FAST_EXP2F(v) exp2f(v)
#define PS_FAST_RCPF(v) (1.0f / (v))
#define PS_FAST_LOG2F(v) log2f(v)
#elif defined(__HIP__) || defined(__HIPCC__)
#define PS_FAST_EXP2F(v) exp2f(v)
#define PS_FAST_RCPF(v) __fdividef(1.0f, (v))
#define PS_FAST_LOG2F(v) __log2f(v)
#else
PS_DEVICE float ps_ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
#define PS_FAST_EXP2F(v) ps_ex2_approx(v)
#define PS_FAST_RCPF(v) __fdividef(1.0f, (v))
#define PS_FAST_LOG2F(v) __log2f(v)
#endif

// A 16-byte store of four words as one instruction. nvcc sometimes splits a 16-byte vector's
// store into 2- or 4-byte stores when a partial slot beside it stores the same elements one by
// one (several times the store requests); st.global.v4 keeps it whole. Elsewhere a plain aligned store.
struct alignas(16) ps_words4 { unsigned w[4]; };
#if defined(__CUDA_ARCH__) && !defined(PORTABLE_SOFTMAX_EMULATION)
PS_DEVICE void ps_store_words4(void* at, const ps_words4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
               "r"(v.w[3]));
}
#else
PS_DEVICE void ps_store_words4(void* at, const ps_words4& v) { *static_cast<ps_words4*>(at) = v; }
#endif

// An empty asm that the compiler must take as changing a word: a 16-bit vector widened again after
// it is not the one widened before, so the few conversions are redone instead of the widened values
// being held in registers in between (twice the registers of the stored vector).
#if (defined(__HIP__) || defined(__HIPCC__)) && !defined(PORTABLE_SOFTMAX_EMULATION)
PS_DEVICE void ps_opaque(unsigned& v) { asm volatile("" : "+v"(v)); }
#else
PS_DEVICE void ps_opaque(unsigned& v) { asm volatile("" : "+r"(v)); }
#endif

// ---- global -> shared copies that bypass registers (NVIDIA sm_80 and newer) --------------------
// cp.async copies 4, 8 or 16 bytes into shared memory without holding them in a register, so a
// thread can have every slot of its chunk in flight at once and wait once. Elsewhere (HIP, the
// emulation, older NVIDIA) PS_ASYNC_COPY is 0 and kernels load through registers.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(PORTABLE_SOFTMAX_EMULATION)
#define PS_ASYNC_COPY 1
template <int BYTES> PS_DEVICE void async_copy(void* shared_at, const void* global_at) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async copies 4, 8 or 16 bytes");
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared_at));
  if (BYTES == 16) {  // .cg: through L2 only; the row is read from shared memory from here on
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(global_at) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(to), "l"(global_at), "n"(BYTES) : "memory");
  }
}
// This thread's copies are done and visible to it (other threads need a barrier as well).
PS_DEVICE void async_copy_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Closes this thread's group of copies issued since the last commit.
PS_DEVICE void async_copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// This thread's committed groups but the `PENDING` newest are done and visible to it.
template <int PENDING> PS_DEVICE void async_copy_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}
#elif defined(PORTABLE_SOFTMAX_EMULATION) && defined(PS_EMULATE_ASYNC_COPY)
// The emulation built to take this path (the tests build it both ways): copies land only at the
// wait and read as poison before it, so a read that does not wait for its copy fails.
#define PS_ASYNC_COPY 1
template <int BYTES> PS_DEVICE void async_copy(void* shared_at, const void* global_at) {
  ps_emu_async_copy(shared_at, global_at, BYTES);
}
PS_DEVICE void async_copy_wait_all() { ps_emu_async_wait_all(); }
PS_DEVICE void async_copy_commit() { ps_emu_async_commit(); }
template <int PENDING> PS_DEVICE void async_copy_wait_group() { ps_emu_async_wait_group(PENDING); }
#else
#define PS_ASYNC_COPY 0
#endif

#if !defined(PS_INF_F)  // clang (HIP, hipRTC) and the host compiler know the builtins
#define PS_INF_F __builtin_huge_valf()
#define PS_NAN_F __builtin_nanf("")
#define PS_INF_D __builtin_huge_val()
#define PS_NAN_D __builtin_nan("")
#endif

#if !defined(PORTABLE_SOFTMAX_EMULATION)
#define PS_GLOBAL extern "C" __global__
#define PS_SHARED __shared__
// A static shared array that asynchronous copies fill (the emulation checks their destinations).
#define PS_SHARED_COPY_TARGET(T, name, n) __shared__ T name[n]
#define PS_SYNC() __syncthreads()
#define PS_THREAD_X threadIdx.x
#define PS_BLOCK_X blockIdx.x
#define PS_BLOCK_DIM_X blockDim.x
#define PS_GRID_DIM_X gridDim.x
#define PS_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
// At most `threads` a block, and registers few enough that `blocks` such blocks fit a
// multiprocessor. HIP's second argument means waves per execution unit: there the thread bound.
#if defined(__HIP__) || defined(__HIPCC__)
#define PS_LAUNCH_BOUNDS_MIN(threads, blocks) __launch_bounds__(threads)
#else
#define PS_LAUNCH_BOUNDS_MIN(threads, blocks) __launch_bounds__(threads, blocks)
#endif
// At most `registers` a thread, the block's threads unbounded, for kernels launched at fewer threads
// than `threads`; where the compiler takes no such cap (CUDA before 12.4, HIP), PS_LAUNCH_BOUNDS_MIN.
#if !defined(__HIP__) && !defined(__HIPCC__) && defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__ >= 1204)
#define PS_MAX_REGISTERS(threads, blocks, registers) __maxnreg__(registers)
#else
#define PS_MAX_REGISTERS(threads, blocks, registers) PS_LAUNCH_BOUNDS_MIN(threads, blocks)
#endif
#define PS_THREAD_FENCE() __threadfence()
#define PS_ATOMIC_ADD(address, value) atomicAdd((address), (value))
// A 64-bit word one block writes and others poll: an aligned 8-byte access is single-copy atomic
// on both vendors, and volatile keeps it out of the non-coherent L1 and out of registers.
#define PS_PUBLISH_WORD(address, value) (*(volatile unsigned long long*)(address) = (value))
#define PS_READ_WORD(address) (*(const volatile unsigned long long*)(address))
// One dynamic shared-memory symbol for every kernel of a translation unit
// (its declarations must agree); 16-byte elements keep any vector aligned.
#define PS_DYNAMIC_SHARED_BYTES(name) extern __shared__ float4 name[]
// Registers an entry point by name for the host emulation; GPU builds look
// kernels up in the code object instead.
#define PS_EXPORT_KERNEL(name)
#endif

// ---- storage type <-> compute type -------------------------------------
// float32/float16/bfloat16 compute in float; float64 computes in double.
template <typename T> struct compute_of { typedef float type; };
template <> struct compute_of<double> { typedef double type; };

PS_DEVICE float to_compute(float v) { return v; }
PS_DEVICE double to_compute(double v) { return v; }
PS_DEVICE float to_compute(half_t v) { return __half2float(v); }
PS_DEVICE float to_compute(bfloat16_t v) { return __bfloat162float(v); }

template <typename T> PS_DEVICE T from_compute(typename compute_of<T>::type v);
template <> PS_DEVICE float from_compute<float>(float v) { return v; }
template <> PS_DEVICE double from_compute<double>(double v) { return v; }
template <> PS_DEVICE half_t from_compute<half_t>(float v) { return __float2half_rn(v); }
template <> PS_DEVICE bfloat16_t from_compute<bfloat16_t>(float v) { return __float2bfloat16_rn(v); }

// ---- math ------------------------------------------------------------------
// a * b + c rounded once, whatever the compiler's contraction flags.
PS_DEVICE float ps_fma(float a, float b, float c) { return fmaf(a, b, c); }
PS_DEVICE double ps_fma(double a, double b, double c) { return fma(a, b, c); }
// Full-precision exp/log, for what happens once per row (and a thread's rare rescale of its
// running sum); per-element exps and merges of (m, d) pairs use ExpMinus below.
PS_DEVICE float ps_exp(float v) { return expf(v); }
PS_DEVICE double ps_exp(double v) { return exp(v); }
PS_DEVICE float ps_log(float v) { return logf(v); }
PS_DEVICE double ps_log(double v) { return log(v); }
PS_DEVICE float ps_log2(float v) { return log2f(v); }
PS_DEVICE double ps_log2(double v) { return log2(v); }
// exp(x - m) / d for the values x of a row whose max is m (d = 1: the plain exp(x - m)).
// float64: the full-precision exp and a division. Values computed in float32 (float32, float16,
// bfloat16 outputs) take the hardware's base-2 exponential of (x - m) log2(e) - log2(d): x - m is
// exact near the max and log2(d) is a small number, so the result's relative error stays near
// 1e-6 for every output above the absolute tolerance of 1e-6 (the tests' float32 bound is 1e-5),
// in three instructions instead of a dozen and a multiply.
// Keyed by the compute type: float32, float16 and bfloat16 outputs all take the float form.
template <typename C> struct ExpMinus {
  C m, scale;
  PS_DEVICE explicit ExpMinus(C m_) : m(m_), scale(C(1)) {}
  PS_DEVICE ExpMinus(C m_, C d, C /* log2_d: the float form's */) : m(m_), scale(C(1) / d) {}
  PS_DEVICE C operator()(C x) const { return ps_exp(x - m) * scale; }
};
template <> struct ExpMinus<float> {
  float m, log2_d;
  PS_DEVICE explicit ExpMinus(float m_) : m(m_), log2_d(0.0f) {}
  PS_DEVICE ExpMinus(float m_, float /* d */, float log2_d_) : m(m_), log2_d(log2_d_) {}
  PS_DEVICE float operator()(float x) const { return PS_FAST_EXP2F(fmaf(x - m, 1.44269504088896341f, -log2_d)); }
};
// exp(x - m) times a factor that every value of a row shares, for rows whose outputs are
// exp / sum (softmax, where it cancels): 2^(x log2(e) - h) with h = m log2(e) rounded, one
// multiply-add and the base-2 exponential where ExpMinus takes a subtraction too. The multiply-add
// rounds each exponent once (ExpMinus twice); the shared factor is 2^(m log2(e) - h), within
// 2^(+-1/16) while |m| <= 2^20 (exp_shift_fits), so that the max's exp stays near 1. float16
// values always fit; a NaN or infinite max gives what ExpMinus gives.
struct ExpShifted {
  static constexpr float kLog2e = 1.44269504088896341f;
  float h;
  PS_DEVICE explicit ExpShifted(float m) : h(m * kLog2e) {}
  PS_DEVICE float operator()(float x) const { return PS_FAST_EXP2F(fmaf(x, kLog2e, -h)); }
  // The shared factor's exponent m log2(e) - h (h's rounding), exactly: one more multiply-add.
  PS_DEVICE float shared_exponent(float m) const { return fmaf(m, kLog2e, -h); }
};
template <typename A, typename B> struct same_type { static const bool value = false; };
template <typename A> struct same_type<A, A> { static const bool value = true; };
template <bool B, typename A, typename Z> struct type_if { typedef A type; };
template <typename A, typename Z> struct type_if<false, A, Z> { typedef Z type; };
template <typename T> PS_DEVICE bool exp_shift_fits(float m) {
  return same_type<T, half_t>::value || (m >= -1048576.0f && m <= 1048576.0f);
}
// 1 / d likewise: the correctly rounded division for float32 / float64 outputs, the hardware
// reciprocal (an ulp or two of float32) for 16-bit ones.
template <typename T> PS_DEVICE typename compute_of<T>::type recip_for(typename compute_of<T>::type v) {
  return typename compute_of<T>::type(1) / v;
}
template <> PS_DEVICE float recip_for<half_t>(float v) { return PS_FAST_RCPF(v); }
template <> PS_DEVICE float recip_for<bfloat16_t>(float v) { return PS_FAST_RCPF(v); }
// log2(d) (softmax) likewise: full precision for float32 / float64 outputs, the hardware's base-2
// logarithm (error near 2^-22, far under a 16-bit output's half ulp) for 16-bit ones, whose short
// rows spent a fifth of their instructions on the full-precision log once a row.
template <typename T> PS_DEVICE typename compute_of<T>::type log2_for(typename compute_of<T>::type v) {
  return sizeof(T) == 2 ? PS_FAST_LOG2F(v) : ps_log2(v);
}
// log(d) (log_softmax): the hardware's base-2 logarithm for every float-computed output, float32
// too. d >= 1 (the max contributes exp(0)), so |x - m - log d| >= log d and the log's relative
// error of about 2^-22 (absolute near d = 1) stays as small relative to every output.
template <typename T> PS_DEVICE typename compute_of<T>::type log_for(typename compute_of<T>::type v) {
  return sizeof(v) == 4 ? PS_FAST_LOG2F(v) * 0.693147180559945309f : ps_log(v);
}

// max that keeps NaN, so that a NaN anywhere in a row reaches every output. NVIDIA sm_80 and
// newer have it as one instruction; elsewhere a compare and a select.
template <typename C> PS_DEVICE C ps_max_nan(C a, C b) { return (a > b || a != a) ? a : b; }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(PORTABLE_SOFTMAX_EMULATION)
template <> PS_DEVICE float ps_max_nan<float>(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif

// The NaN-keeping max of two pairs of 16-bit floats, each pair one 32-bit word, element by
// element: one instruction on NVIDIA sm_80 and newer (PackedMax<T>::native); elsewhere kernels
// widen the pairs and take ps_max_nan.
template <typename T> struct PackedMax { static const bool native = false; };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(PORTABLE_SOFTMAX_EMULATION)
template <typename T, typename T2> struct PackedMaxOf {
  static const bool native = true;
  static PS_DEVICE unsigned max(unsigned a, unsigned b) {
    T2 pa, pb;
    memcpy(&pa, &a, 4);
    memcpy(&pb, &b, 4);
    const T2 r = __hmax2_nan(pa, pb);
    unsigned out;
    memcpy(&out, &r, 4);
    return out;
  }
};
template <> struct PackedMax<half_t> : PackedMaxOf<half_t, __half2> {};
template <> struct PackedMax<bfloat16_t> : PackedMaxOf<bfloat16_t, __hip_bfloat162> {};
#endif

template <typename C> PS_DEVICE C ps_neg_inf() { return -PS_INF_F; }
template <> PS_DEVICE double ps_neg_inf<double>() { return -PS_INF_D; }
template <typename C> PS_DEVICE C ps_lowest() { return -3.40282346638528859812e+38f; }  // the lowest finite value
template <> PS_DEVICE double ps_lowest<double>() { return -1.79769313486231570815e+308; }
template <typename C> PS_DEVICE C ps_nan() { return PS_NAN_F; }
template <> PS_DEVICE double ps_nan<double>() { return PS_NAN_D; }
