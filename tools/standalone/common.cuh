// Helpers shared by the standalone measurements (block_rows.cu, split_bulk.cu).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>
#include <algorithm>
#include <cstdint>
#include <cmath>
__host__ __device__ __forceinline__ long lmin(long a, long b) { return a < b ? a : b; }

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ float ex2(float v) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v)); return r; }
__host__ __device__ __forceinline__ float tof(float v) { return v; }
__host__ __device__ __forceinline__ float tof(__nv_bfloat16 v) { return __bfloat162float(v); }

struct MD { float m, d; };
__device__ __forceinline__ MD comb(MD a, MD b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return MD{-INFINITY, 0.f};
  return MD{m, a.d * ex2((a.m - m) * 1.4426950408889634f) + b.d * ex2((b.m - m) * 1.4426950408889634f)};
}
__device__ MD block_reduce(MD md) {
  __shared__ float wm[32], wd[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o; o /= 2) md = comb(md, MD{__shfl_xor_sync(~0u, md.m, o), __shfl_xor_sync(~0u, md.d, o)});
  if (lane == 0) { wm[warp] = md.m; wd[warp] = md.d; }
  __syncthreads();
  if (warp == 0) {
    MD p{-INFINITY, 0.f};
    if (lane < warps) p = MD{wm[lane], wd[lane]};
    for (int o = 16; o; o /= 2) p = comb(p, MD{__shfl_xor_sync(~0u, p.m, o), __shfl_xor_sync(~0u, p.d, o)});
    if (lane == 0) { wm[0] = p.m; wd[0] = p.d; }
  }
  __syncthreads();
  MD t{wm[0], wd[0]};
  __syncthreads();
  return t;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* b, unsigned phase) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n\t}" ::"r"(smem_addr(b)), "r"(phase) : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_addr(src)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// This thread's copies of cp.async group g (of GROUPS committed, g unrolled) and of those before it have landed.
template <int GROUPS> __device__ __forceinline__ void wait_for_group(int g) {
  if (g == 0) asm volatile("cp.async.wait_group %0;" ::"n"(GROUPS - 1) : "memory");
  else if (g == 1) asm volatile("cp.async.wait_group %0;" ::"n"(GROUPS > 2 ? GROUPS - 2 : 0) : "memory");
  else if (g == 2) asm volatile("cp.async.wait_group %0;" ::"n"(GROUPS > 3 ? GROUPS - 3 : 0) : "memory");
  else asm volatile("cp.async.wait_group 0;" ::: "memory");
}

template <typename T> __device__ __forceinline__ void widen16(const float4& r, float* v);
template <> __device__ __forceinline__ void widen16<float>(const float4& r, float* v) { v[0] = r.x; v[1] = r.y; v[2] = r.z; v[3] = r.w; }
template <> __device__ __forceinline__ void widen16<__nv_bfloat16>(const float4& r, float* v) {
  const unsigned* w = reinterpret_cast<const unsigned*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) { v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}
template <typename T> __device__ __forceinline__ float4 narrow16(const float* v);
template <> __device__ __forceinline__ float4 narrow16<float>(const float* v) { return make_float4(v[0], v[1], v[2], v[3]); }
template <> __device__ __forceinline__ float4 narrow16<__nv_bfloat16>(const float* v) {
  float4 r;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  return r;
}

constexpr float kLog2e = 1.4426950408889634f;

// A 16-byte slot widened, each value mapped by f, narrowed back.
template <typename T, typename F> __device__ __forceinline__ float4 map16(const float4& raw, F f) {
  constexpr int VEC = 16 / sizeof(T);
  float v[VEC];
  widen16<T>(raw, v);
#pragma unroll
  for (int e = 0; e < VEC; ++e) v[e] = f(v[e]);
  return narrow16<T>(v);
}
// One 16-byte store instruction (nvcc may split a plain one).
__device__ __forceinline__ void store16(float4* at, const float4& o) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(at), "r"(__float_as_uint(o.x)), "r"(__float_as_uint(o.y)),
               "r"(__float_as_uint(o.z)), "r"(__float_as_uint(o.w)));
}

// A thread's streaming (m, d) over 16-byte slots. KAHAN: compensated sum. SHIFT: exps as
// 2^(x log2 e - h), h = m log2 e, and rescales by the base-2 exp (else 2^((x - m) log2 e), expf).
template <typename T, int KAHAN, int SHIFT> struct RowSum {
  float m = -INFINITY, d = 0.f, carry = 0.f;
  __device__ void push(const float4& raw) {
    constexpr int VEC = 16 / sizeof(T);
    float v[VEC];
    widen16<T>(raw, v);
    float top = v[0];
#pragma unroll
    for (int e = 1; e < VEC; ++e) top = fmaxf(top, v[e]);
    if (top > m) {
      const float sc = m == -INFINITY ? 0.f : (SHIFT ? ex2((m - top) * kLog2e) : expf(m - top));
      d *= sc;
      carry *= sc;
      m = top;
    }
    float s = 0.f;
    if (SHIFT) {
      const float h = m * kLog2e;
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += ex2(fmaf(v[e], kLog2e, -h));
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += ex2(fmaf(v[e] - m, kLog2e, -0.0f));
    }
    if (KAHAN) {
      const float yk = s - carry, t = d + yk;
      carry = (t - d) - yk;
      d = t;
    } else {
      d += s;
    }
  }
  __device__ MD md() const { return MD{m, d}; }
};

__global__ void fill(float* p, long n, unsigned seed) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    if (seed & 0x100) {  // about normal * 4: a sum of 12 uniforms
      float acc = 0.f;
      for (int k = 0; k < 12; ++k) { h ^= h << 13; h ^= h >> 17; h ^= h << 5; acc += (h & 0xffffff) / 16777216.0f; }
      p[i] = (acc - 6.0f) * 4.0f;
    } else {
      p[i] = ((h & 0xffffff) / 16777216.0f - 0.5f) * 8.0f;
    }
  }
}
__global__ void tobf(const float* a, __nv_bfloat16* b, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) b[i] = __float2bfloat16_rn(a[i]);
}

// 256 MiB inputs (float32 and bfloat16), outputs and an L2 flush buffer, and event timings.
struct Bench {
  static constexpr long kBytes = 256L << 20;
  static constexpr int kReps = 10;
  float *xf, *yf, *tmp;
  __nv_bfloat16 *xb, *yb;
  void* flush;
  cudaEvent_t a, b;
  Bench() {
    CK(cudaMalloc(&xf, kBytes));
    CK(cudaMalloc(&yf, kBytes));
    CK(cudaMalloc(&xb, kBytes));
    CK(cudaMalloc(&yb, kBytes));
    CK(cudaMalloc(&tmp, kBytes * 2));
    CK(cudaMalloc(&flush, kBytes));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    fill_inputs(false);
  }
  // Uniform in +-4, or (normal) about normal times 4.
  void fill_inputs(bool normal) {
    fill<<<1024, 256>>>(xf, kBytes / 4, normal ? 0x107 : 7);
    fill<<<1024, 256>>>(tmp, kBytes / 2, normal ? 0x109 : 9);
    tobf<<<1024, 256>>>(tmp, xb, kBytes / 2);
    CK(cudaDeviceSynchronize());
  }
  // Median over kReps of launch(), each after poisoning y and flushing the L2.
  template <typename Launch> float median_ms(void* y, Launch launch) const {
    std::vector<float> t;
    for (int r = 0; r < kReps; ++r) {
      CK(cudaMemsetAsync(y, 0xff, kBytes));
      CK(cudaMemsetAsync(flush, r + 1, kBytes));
      CK(cudaEventRecord(a));
      launch();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      CK(cudaGetLastError());
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  float copy_ms() const {
    return median_ms(yf, [&] { CK(cudaMemcpyAsync(yf, xf, kBytes, cudaMemcpyDeviceToDevice)); });
  }
};

// The largest |sum - 1| over the first, middle and last output rows.
template <typename T> double row_sum_error(const T* y, long rows, long cols) {
  std::vector<T> h(cols);
  double err = 0;
  for (long r : {0L, rows / 2, rows - 1}) {
    CK(cudaMemcpy(h.data(), y + r * cols, cols * sizeof(T), cudaMemcpyDeviceToHost));
    double s = 0;
    for (long i = 0; i < cols; ++i) s += (double)tof(h[i]);
    err = std::max(err, std::abs(s - 1.0));
  }
  return err;
}
