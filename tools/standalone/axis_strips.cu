// Standalone measurement (not part of the package): softmax over axis 0 of a rows x cols matrix by
// strips, a block a strip of the whole reduced axis and one 16-byte vector of columns, cached in
// shared memory (cp.async in GROUPS commit groups), with no merge across blocks: each strip's
// (m, d) per column is the block's own. The grid's strips sit side by side in memory, so at any
// moment neighbouring blocks read neighbouring 16-byte pieces of the same rows. Beside it, the
// same strips copied (cache, then store: the pattern's own ceiling) and the device copy.
// Build and run on an sm_90 GPU:  nvcc -arch=sm_90 -O3 -std=c++17 -o axis_strips axis_strips.cu -lcuda && ./axis_strips
#include "common.cuh"

// A block a strip of 16-byte vectors down the reduced axis; SOFTMAX 0 copies the strip.
template <typename T, int THREADS, int GROUPS, int SOFTMAX>
__global__ void __launch_bounds__(THREADS, 1) strips(const T* x, T* y, long rows, long cols) {
  constexpr int VEC = 16 / sizeof(T);
  extern __shared__ float4 cache[];
  __shared__ float part_m[THREADS / 32][VEC], part_d[THREADS / 32][VEC];
  const long strips_count = cols / VEC;
  const long row_vectors = cols / VEC;
  for (long strip = blockIdx.x; strip < strips_count; strip += gridDim.x) {
    const float4* src = reinterpret_cast<const float4*>(x) + strip;
    float4* dst = reinterpret_cast<float4*>(y) + strip;
    const int n = (int)rows;
    int j = threadIdx.x;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      for (; j < n * (g + 1) / GROUPS; j += THREADS) cp16(cache + j, src + j * row_vectors);
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
    if (!SOFTMAX) {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
      for (j = threadIdx.x; j < n; j += THREADS) store16(dst + j * row_vectors, cache[j]);
      __syncthreads();
      continue;
    }
    // A thread's (m, d) per column of the strip, over its rows.
    float m[VEC], d[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) { m[e] = -INFINITY; d[e] = 0.f; }
    j = threadIdx.x;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      wait_for_group<GROUPS>(g);
      for (; j < n * (g + 1) / GROUPS; j += THREADS) {
        float v[VEC];
        widen16<T>(cache[j], v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (v[e] > m[e]) { d[e] *= ex2((m[e] - v[e]) * kLog2e); m[e] = v[e]; }
          d[e] += ex2((v[e] - m[e]) * kLog2e);
        }
      }
    }
    // The block's (m, d) per column: warps by shuffles, then across warps.
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      MD md{m[e], d[e]};
      for (int o = 16; o; o /= 2) md = comb(md, MD{__shfl_xor_sync(~0u, md.m, o), __shfl_xor_sync(~0u, md.d, o)});
      if (lane == 0) { part_m[warp][e] = md.m; part_d[warp][e] = md.d; }
    }
    __syncthreads();
    float h[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      MD md{-INFINITY, 0.f};
      for (int w = 0; w < THREADS / 32; ++w) md = comb(md, MD{part_m[w][e], part_d[w][e]});
      h[e] = md.m * kLog2e + __log2f(md.d);
    }
    for (j = threadIdx.x; j < n; j += THREADS) {
      float v[VEC];
      widen16<T>(cache[j], v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = ex2(fmaf(v[e], kLog2e, -h[e]));
      store16(dst + j * row_vectors, narrow16<T>(v));
    }
    __syncthreads();  // the scratch and the cache are reused by the next strip
  }
}

struct Timing { float ms; double err; };

// The largest |column sum - 1| over the first, middle and last columns.
template <typename T> double column_sum_error(const T* y, long rows, long cols) {
  std::vector<T> h(rows * cols);
  CK(cudaMemcpy(h.data(), y, rows * cols * sizeof(T), cudaMemcpyDeviceToHost));
  double err = 0;
  for (long c : {0L, cols / 2 + 1, cols - 1}) {
    double s = 0;
    for (long r = 0; r < rows; ++r) s += (double)tof(h[r * cols + c]);
    err = std::max(err, std::abs(s - 1.0));
  }
  return err;
}

template <typename T, int THREADS, int GROUPS, int SOFTMAX>
Timing run_strips(const Bench& bench, const T* x, T* y, long rows, long cols, int waves) {
  auto kernel = strips<T, THREADS, GROUPS, SOFTMAX>;
  const size_t shared = (size_t)rows * 16;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long strips_count = cols * (long)sizeof(T) / 16;
  const long grid = waves > 0 ? std::min<long>((long)sms * waves, strips_count) : strips_count;
  Timing t{0, 0};
  t.ms = bench.median_ms(y, [&] { kernel<<<grid, THREADS, shared>>>(x, y, rows, cols); });
  t.err = SOFTMAX ? column_sum_error(y, rows, cols) : 0.0;
  return t;
}

int main() {
  setvbuf(stdout, NULL, _IONBF, 0);
  Bench bench;
  const long bytes = Bench::kBytes;
  const float copy = bench.copy_ms();
  printf("copy %.4f ms (%.0f GB/s)\n", copy, 2.0 * bytes / copy / 1e6);
  auto rep = [&](const char* what, long rows, long cols, Timing t) {
    printf("  %-32s %ldx%ld axis 0 %5.1f%% of copy  (|col sum-1| %.1e)\n", what, rows, cols, 100 * copy / t.ms, t.err);
  };
  for (int pass = 0; pass < 2; ++pass) {
    {
      const long rows = 8192, cols = 8192;
      float* x = bench.xf;
      float* y = bench.yf;
      rep("f32 copy strips 1024t g4 all", rows, cols, run_strips<float, 1024, 4, 0>(bench, x, y, rows, cols, 0));
      rep("f32 strips 1024t g4 all", rows, cols, run_strips<float, 1024, 4, 1>(bench, x, y, rows, cols, 0));
      rep("f32 strips 1024t g4 wave1", rows, cols, run_strips<float, 1024, 4, 1>(bench, x, y, rows, cols, 1));
      rep("f32 strips 1024t g1 all", rows, cols, run_strips<float, 1024, 1, 1>(bench, x, y, rows, cols, 0));
      rep("f32 strips 512t g4 all", rows, cols, run_strips<float, 512, 4, 1>(bench, x, y, rows, cols, 0));
    }
    {
      const long rows = 4096, cols = 16384;
      rep("f32 strips 1024t g4 all", rows, cols, run_strips<float, 1024, 4, 1>(bench, bench.xf, bench.yf, rows, cols, 0));
    }
    {
      const long rows = 8192, cols = 16384;
      __nv_bfloat16* x = bench.xb;
      __nv_bfloat16* y = bench.yb;
      rep("bf16 copy strips 512t g4 all", rows, cols, run_strips<__nv_bfloat16, 512, 4, 0>(bench, x, y, rows, cols, 0));
      rep("bf16 strips 512t g4 all", rows, cols, run_strips<__nv_bfloat16, 512, 4, 1>(bench, x, y, rows, cols, 0));
      rep("bf16 strips 512t g2 all", rows, cols, run_strips<__nv_bfloat16, 512, 2, 1>(bench, x, y, rows, cols, 0));
    }
  }
  return 0;
}
